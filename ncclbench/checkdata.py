"""Per-rank input values and exact expected results.

Inputs differ by rank and by element and are small integers chosen per dtype, op and
rank count so that every partial sum, product, min or max is exactly representable:
the reduction order then cannot change a single bit and the check can be exact
(only `avg` on floats divides, so it gets a tolerance). Everything here is a pure
function of (rank, element index, seed) evaluated on index tensors, so expected values
for any slice of any rank's output can be computed without communication."""

from __future__ import annotations

from dataclasses import dataclass

from ncclbench.dtypes import DType

_MAX_RANGE = 97  # a prime, so that patterns do not line up with power-of-two sizes


def premul_scalar(rank: int) -> int:
    """-o mulsum: the factor rank `rank` (in its communicator) multiplies its input by.
    2 or 1, exact in every type, and different between neighbours so that a backend that
    ignored the factor, or used one rank's for all, gives wrong sums; rank 0's is 2, so
    that even a one-rank run shows a factor that was not applied."""
    return 2 - rank % 2


@dataclass(frozen=True)
class InputPattern:
    dtype: DType
    op: str
    nranks: int
    seed: int

    @property
    def value_range(self) -> int:
        """Values lie in [0, value_range): n * (value_range - 1) must stay exact (2n for
        mulsum, whose factors are at most 2)."""
        return min(_MAX_RANGE, self.dtype.exact_limit // (max(self.nranks, 1) * self._factor) + 1)

    @property
    def _factor(self) -> int:
        return 2 if self.op == "mulsum" else 1

    @property
    def sparse(self) -> bool:
        # Too many ranks for even 0/1 values to sum exactly (fp8 with > 16 ranks):
        # each element gets a non-zero value on one rank only.
        return self.value_range < 2

    def values(self, src_rank: int, idx):
        """int64 tensor of rank `src_rank`'s input at element indices `idx` (int64 tensor)."""
        if self.op == "prod":
            # At most one rank contributes a 2 to each element, the rest 1: the product
            # is 1 or 2, exact in every type, yet depends on rank and element.
            owner = (idx + self.seed) % (self.nranks + 1)
            return 1 + (owner == src_rank).long()
        if self.sparse:
            limit = self.dtype.exact_limit // self._factor + 1
            base = (idx * 7 + self.seed) % limit
            return base * ((idx % self.nranks) == src_rank).long()
        return (idx * 7 + src_rank * 13 + self.seed) % self.value_range

    def reduce(self, idx, ranks):
        """Exact reduction over `ranks` of their inputs at `idx` (int64 tensor; avg is float64)."""
        import torch

        acc = None
        for r in ranks:
            v = self.values(r, idx)
            if self.op == "mulsum":
                v = v * premul_scalar(r)
                acc = v if acc is None else acc + v
                continue
            if acc is None:
                acc = v.clone()
            elif self.op in ("sum", "avg"):
                acc += v
            elif self.op == "prod":
                acc *= v
            elif self.op == "min":
                acc = torch.minimum(acc, v)
            elif self.op == "max":
                acc = torch.maximum(acc, v)
            else:
                raise ValueError(f"no reduction for op {self.op!r}")
        if self.op == "avg":
            return acc.double() / len(ranks)
        return acc


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


def bit_view(tensor, dtype: DType):
    import torch

    return tensor.view(getattr(torch, dtype.signed_view))


def count_mismatches(actual, expected_values, dtype: DType, op: str, nranks: int) -> int:
    """Number of elements of `actual` that differ from the exact `expected_values`."""
    import torch

    if actual.numel() == 0:
        return 0
    if op == "avg":
        got = _as_float64(actual, dtype)
        exp = expected_values.double()
        if dtype.is_float:
            # NCCL pre-multiplies by 1/n or divides at the end: a few ulps either way.
            eps = torch.finfo(dtype.torch_dtype()).eps
            tol = exp.abs().clamp(min=1.0) * eps * (nranks + 2)
        else:
            tol = torch.ones_like(exp)  # integer average truncates, backends round differently
        return int(((got - exp).abs() > tol).sum().item())
    exp_bits = bit_view(to_dtype(expected_values, dtype), dtype)
    return int((bit_view(actual, dtype) != exp_bits).sum().item())


def _as_float64(tensor, dtype: DType):
    import torch

    if dtype.name in ("uint32", "uint64"):
        return tensor.view(getattr(torch, dtype.signed_view)).double()
    if dtype.is_float and dtype.itemsize == 1:
        return tensor.float().double()
    return tensor.double()
