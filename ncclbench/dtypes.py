"""Element types and reduction ops: nccl-tests names, torch types, exactness limits."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str               # nccl-tests spelling, printed in the `type` column
    torch_name: str         # attribute of the torch module
    itemsize: int
    is_float: bool
    # Largest integer N such that 0..N and all sums of such values up to N are exact:
    # inputs are chosen so that every partial result stays below it, which makes
    # sum/min/max/prod bit-exact in any reduction order.
    exact_limit: int
    signed_view: str        # same-size signed integer type used to compare bit patterns

    def torch_dtype(self):
        import torch

        return getattr(torch, self.torch_name, None)


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("int8", "int8", 1, False, 127, "int8"),
        DType("uint8", "uint8", 1, False, 255, "int8"),
        DType("int32", "int32", 4, False, 2**31 - 1, "int32"),
        DType("uint32", "uint32", 4, False, 2**31 - 1, "int32"),
        DType("int64", "int64", 8, False, 2**53, "int64"),
        DType("uint64", "uint64", 8, False, 2**53, "int64"),
        DType("half", "float16", 2, True, 2048, "int16"),
        DType("float", "float32", 4, True, 2**24, "int32"),
        DType("double", "float64", 8, True, 2**53, "int64"),
        DType("bfloat16", "bfloat16", 2, True, 256, "int16"),
        DType("f8e4m3", "float8_e4m3fn", 1, True, 16, "int8"),
        DType("f8e5m2", "float8_e5m2", 1, True, 8, "int8"),
    )
}

DTYPE_ALIASES = {
    "char": "int8", "uchar": "uint8", "int": "int32", "uint": "uint32",
    "float16": "half", "fp16": "half", "float32": "float", "fp32": "float",
    "float64": "double", "fp64": "double", "bf16": "bfloat16",
    "fp8_e4m3": "f8e4m3", "float8_e4m3": "f8e4m3", "e4m3": "f8e4m3",
    "fp8_e5m2": "f8e5m2", "float8_e5m2": "f8e5m2", "e5m2": "f8e5m2",
}

# nccl-tests' order, used by `-o all`. mulsum is NCCL's premul-sum (ncclRedOpCreatePreMulSum):
# each rank's input is multiplied by that rank's scalar (checkdata.premul_scalar), then summed.
OPS = ("sum", "prod", "max", "min", "avg", "mulsum")


def resolve_dtypes(text: str) -> list[DType]:
    """`-d` value -> list of types (`all` expands in nccl-tests' order). Raises ValueError."""
    key = text.strip().lower()
    if key == "all":
        return list(DTYPES.values())
    name = DTYPE_ALIASES.get(key, key)
    if name not in DTYPES:
        raise ValueError(f"unknown datatype {text!r}; choose from {', '.join(DTYPES)} or all")
    return [DTYPES[name]]


def resolve_ops(text: str) -> list[str]:
    key = text.strip().lower()
    if key == "all":
        return list(OPS)
    if key not in OPS:
        raise ValueError(f"unknown op {text!r}; choose from {', '.join(OPS)} or all")
    return [key]


def premul_scalar(rank: int) -> int:
    """-o mulsum: the factor rank `rank` (in its communicator) multiplies its input by.
    2 or 1, exact in every type, and different between neighbours so that a backend that
    ignored the factor, or used one rank's for all, gives wrong sums; rank 0's is 2, so
    that even a one-rank run shows a factor that was not applied."""
    return 2 - rank % 2


def to_dtype(values, dtype: DType):
    """Cast exact integer values (int64 or float64 tensor) into `dtype`."""
    import torch

    target = dtype.torch_dtype()
    if dtype.name in ("uint32", "uint64"):
        # torch's unsigned 32/64-bit types are storage-only: build the bits in the signed
        # twin (values are non-negative, so the bits are identical).
        return values.to(getattr(torch, dtype.signed_view)).view(target)
    if dtype.is_float and dtype.itemsize == 1:
        return values.to(torch.float32).to(target)
    return values.to(target)
