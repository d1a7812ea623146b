"""What each backend can run, as data: read before any rank starts (by the plan, on the
launcher, where torch is not imported), so nothing here imports a backend.

A collective's own gaps (one that a backend has for that collective only) live in its
registry entry (ncclbench.engine.collectives), in the same form."""

from __future__ import annotations

from dataclasses import dataclass

from ncclbench.dtypes import DTYPES

BACKENDS = ("nccl", "gloo", "cupy")
TORCH = frozenset({"nccl", "gloo"})  # the backends that run through torch.distributed's process groups
NCCL = frozenset({"nccl", "cupy"})   # the backends whose collectives are NCCL's

_INT_TYPES = frozenset({"int8", "uint8", "int32", "uint32", "int64", "uint64"})
_FP8_TYPES = frozenset({"f8e4m3", "f8e5m2"})
_UNSIGNED_WIDE = frozenset({"uint32", "uint64"})
# ProcessGroupNCCL makes a premul-sum op for half, float, double and bfloat16 only (a
# TypeError otherwise), and its bfloat16 one gave wrong sums (1014 of 1024 elements, torch
# 2.11 + NCCL 2.28.9, benchmarks/probe_dtypes.py) where CuPy's was right.
_PREMUL_TYPES = frozenset({"half", "float", "double"})


@dataclass(frozen=True)
class Gap:
    """Something `backends` cannot run: `dtypes` (None: any) with the reductions `ops`
    (None: any, and collectives that reduce nothing), in any communicator or (`one_rank`)
    in one-rank ones only. `reason` is the line that refuses it; {dtype} and {op} are
    filled in."""

    backends: frozenset[str]
    reason: str
    dtypes: frozenset[str] | None = None
    ops: frozenset[str] | None = None
    one_rank: bool = False

    def refuses(self, backend: str, dtype: str, op: str | None, nranks: int | None) -> str | None:
        """The reason, where this gap covers `dtype` with `op` on `backend` in communicators
        of `nranks` ranks (None: not known yet, so no one-rank gap applies); else None."""
        if backend not in self.backends or (self.dtypes is not None and dtype not in self.dtypes):
            return None
        if (self.ops is not None and op not in self.ops) or (self.one_rank and nranks != 1):
            return None
        return self.reason.format(dtype=dtype, op=op)


# Known gaps, refused before launching rather than discovered mid-sweep (gloo aborts the
# process on some bad calls instead of raising); how they were probed:
# docs/design/dtype-support.md. The first that applies is the one reported.
GAPS = (
    Gap(frozenset({"gloo"}), "backend gloo has no datatype {dtype}", dtypes=_FP8_TYPES | _UNSIGNED_WIDE),
    Gap(frozenset({"gloo"}), "backend gloo cannot average integers ({dtype}); use -o sum or a float type",
        dtypes=_INT_TYPES, ops=frozenset({"avg"})),
    Gap(frozenset({"gloo"}), "backend gloo has no mulsum (NCCL's premul-sum); use a GPU backend or another -o",
        ops=frozenset({"mulsum"})),
    Gap(frozenset({"nccl"}), "torch.distributed's NCCL process group has no {dtype}; use --backend cupy",
        dtypes=_UNSIGNED_WIDE),
    Gap(frozenset({"nccl"}), "torch.distributed's bfloat16 premul-sum gave wrong sums when probed (torch 2.11); "
        "use --backend cupy", dtypes=frozenset({"bfloat16"}), ops=frozenset({"mulsum"})),
    Gap(frozenset({"nccl"}), "torch.distributed's NCCL process group runs mulsum (premul-sum) right only for "
        "half, float and double, not {dtype}; use --backend cupy",
        dtypes=frozenset(DTYPES) - _PREMUL_TYPES, ops=frozenset({"mulsum"})),
    # NCCL 2.28.9 answers "invalid argument" (all_reduce and reduce, both backends)
    Gap(NCCL, "NCCL refuses {op} on {dtype} in a one-rank communicator; run 2 or more ranks per communicator "
        "(-g, or larger --split groups)", dtypes=_FP8_TYPES, ops=frozenset({"avg", "mulsum"}), one_rank=True),
)
