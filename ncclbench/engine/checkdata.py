"""Per-rank input values and exact expected results.

Every value is a pure function of (rank, element index, seed), evaluated on index
tensors, so the expected values of any slice of any rank's output are computed without
communication. Ranks are permuted per seed, and the schemes below are chosen so that a
fault cannot hide behind the data (docs/checks.md has the reasoning and the limits):

- Data movement (no reduction op): rank r's value at element i is a codebook entry (a
  distinct integer exact in the type, never the poison pattern) whose code is a hash of
  i plus one base-K digit of r's permuted number. Two ranks differ at every element when
  the codebook has at least as many entries as there are ranks; in 1-byte types past
  109-255 ranks, at least at every second element.
- Reductions: ranks form G groups of at most g; element i has one active group, whose
  members contribute op-specific values that differ between members, while every other
  rank contributes the op's identity (0 for sums, 1 for prod, the codebook's end for
  min/max). Every rank is active once every G elements, which is where a missing or
  misplaced contribution shows. Budgets keep every partial sum or product an exact
  integer of the type, so sum, prod, min, max and mulsum are bit-exact in any order.
- prod: one member contributes m in [3, M], the others 2: the product m * 2^(g-1) is
  never the max (m), the min (1 or 2) or the sum.
- avg on floats: one contributor per element, so the only rounding is NCCL's x * (1/n)
  and a 2-ulp tolerance (as nccl-tests') cannot swallow a missing rank (the element
  then reads 0). avg on integers: the group's sum is balanced to a multiple of n, so
  the truncating average is exact and a missing rank always lowers it."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ncclbench.dtypes import DType, to_dtype

GROUP_MAX = 32  # ranks active per element in a reduction: bounds the checker's work
CODEBOOK_MAX = 4095  # data-movement values per type (fewer where the type has fewer exact integers)
_P = 2**31 - 1  # hash modulus: products of two residues stay below 2^62 (exact in int64)


def _hash(idx, seed: int):
    """Pseudo-random residues in [0, _P) per element, the same on CPU and GPU (only exact
    int64 arithmetic). Non-linear: a window of elements shifted by a multiple of some
    period does not repeat another window's values, as a linear sequence would."""
    x = (idx + seed * 40503 + 17) % _P
    x = (x * 48271 + 11) % _P
    x = x ^ (x >> 13)
    x = (x * x + 2 * seed + 1) % _P
    x = x ^ (x >> 11)
    return (x * 69621 + seed) % _P


@functools.lru_cache(maxsize=None)
def codebook(dtype: DType) -> tuple[int, ...]:
    """Distinct integers exact in `dtype`, ascending, at most CODEBOOK_MAX, never the
    poison bit pattern (all ones: -1 for signed integers, the maximum for unsigned ones,
    NaN for floats), nearest zero first when the type has more."""
    if not dtype.is_float:
        if dtype.name.startswith("uint"):
            top = min(CODEBOOK_MAX, 2 ** (8 * dtype.itemsize) - 1)  # 255 (uint8's poison) excluded
            return tuple(range(top))
        half = min(CODEBOOK_MAX // 2 + 1, 2 ** (8 * dtype.itemsize - 1))
        return tuple(v for v in range(-half, half) if v != -1)
    if dtype.itemsize > 2:
        half = CODEBOOK_MAX // 2
        return tuple(range(-half, half + 1))
    import torch

    bits = torch.arange(2 ** (8 * dtype.itemsize), dtype=torch.int64).to(getattr(torch, dtype.signed_view))
    vals = bits.view(dtype.torch_dtype()).float().double()
    vals = vals[torch.isfinite(vals) & (vals == vals.round()) & (vals.abs() < 2**31)]
    ints = sorted({int(v) for v in vals.tolist()}, key=lambda v: (abs(v), v))[:CODEBOOK_MAX]
    return tuple(sorted(ints))


@functools.lru_cache(maxsize=64)
def _codebook_tensor(dtype: DType, device: str):
    import torch

    return torch.tensor(codebook(dtype), dtype=torch.int64, device=device)


@dataclass(frozen=True)
class InputPattern:
    dtype: DType
    op: str | None      # the reduction, or None for collectives that only move data
    nranks: int
    seed: int

    # ---- the scheme's parameters, fixed per (dtype, op, nranks, seed) -----------------
    @functools.cached_property
    def _scheme(self) -> dict:
        n, limit = max(self.nranks, 1), _result_limit(self.dtype)
        s = {"shift": (self.seed * 2654435761) % _P}
        mean = _integer_mean(n, self.dtype) if self.op == "avg" and not self.dtype.is_float else None
        if self.op is None:
            k = len(codebook(self.dtype))
            s.update(kind="move", K=k, digits=_digits(n, k))
        elif self.op in ("max", "min"):
            s.update(kind="extreme", g=min(n, GROUP_MAX), K=len(codebook(self.dtype)))
        elif self.op == "prod":
            g = min(n, GROUP_MAX, max(2, int(math.log2(limit)) - 2))
            while g > 1 and limit // 2 ** (g - 1) < 4:
                g -= 1
            s.update(kind="prod", g=g, M=limit // 2 ** (g - 1))
        elif self.op == "avg" and self.dtype.is_float:
            # 2^low / n at least 4 of the type's smallest steps, so that 0 (a missing rank) is
            # more than the tolerance away
            info = _finfo(self.dtype)
            low = max(0, math.ceil(math.log2(4 * info.smallest_normal * info.eps * n)))
            s.update(kind="average", g=1, low=low, high=max(low, int(math.log2(limit))))
        elif mean is not None:
            s.update(kind="mean", g=mean[0], t_min=mean[1], positive=mean[2], negative=mean[3])
        else:  # sum, mulsum (and avg of 8-bit integers over more ranks than their range)
            budget = limit // (2 if self.op == "mulsum" else 1)
            g = max(1, min(n, GROUP_MAX, (math.isqrt(4 * budget + 1) - 1) // 2))  # g(g+1) <= budget
            s.update(kind="add", g=g, U=max(1, budget // g))
        if "g" in s:
            s["G"] = -(-n // s["g"])
        return s

    @functools.cached_property
    def _permutation(self) -> tuple[int, int, int]:
        """(a, b, a^-1 mod n): rank r's place is (a*r + b) mod n, a bijection."""
        n = max(self.nranks, 1)
        a = 1 + (self.seed * 7919) % n
        while math.gcd(a, n) != 1:
            a += 1
        a %= n
        return a, (self.seed * 104729) % n, pow(a, -1, n) if n > 1 else 0

    def permuted(self, rank):
        a, b, _ = self._permutation
        return (rank * a + b) % max(self.nranks, 1)

    def unpermuted(self, place):
        _, b, a_inv = self._permutation
        return ((place - b) * a_inv) % max(self.nranks, 1)

    @property
    def span(self) -> int:
        """Consecutive elements within which every two ranks' inputs differ and (for a
        reduction) every rank contributes a value other than the op's identity."""
        s = self._scheme
        if s["kind"] == "move":
            return s["digits"]
        return s["G"] * (s["g"] if s["kind"] == "prod" else 1)

    # ---- inputs -------------------------------------------------------------------------
    def values(self, src_rank, idx):
        """int64 tensor of rank `src_rank`'s input at element indices `idx` (int64 tensor);
        `src_rank` may be an int64 tensor that broadcasts with `idx`."""
        import torch

        s = self._scheme
        place = self.permuted(src_rank)
        if s["kind"] == "move":
            return self._moved(place, idx)
        terms = self._terms(idx)
        member = place // s["G"]
        active = (place % s["G"]) == terms["group"]
        return torch.where(active, self._member_value(member, terms), self._identity())

    def _moved(self, place, idx):
        s = self._scheme
        k = s["K"]
        digit = place % k
        if s["digits"] > 1:  # one base-K digit of the rank's place per element, in turn
            position = (idx + s["shift"]) % s["digits"]
            digit = (place // k ** position) % k
        return _codebook_tensor(self.dtype, str(idx.device))[(_hash(idx, self.seed) % k + digit) % k]

    def _identity(self):
        kind = self._scheme["kind"]
        if kind == "extreme":
            book = codebook(self.dtype)
            return book[0] if self.op == "max" else book[-1]
        return 1 if kind == "prod" else 0

    def _terms(self, idx) -> dict:
        """What every member's value at `idx` derives from, computed once per call: the
        active group and the scheme's per-element draws."""
        s, h = self._scheme, _hash(idx, self.seed)
        at = idx + s["shift"]
        terms = {"group": at % s["G"]}
        kind = s["kind"]
        if kind == "average":  # powers of two: distinct averages differ by 2x, far beyond the tolerance
            terms["value"] = 2 ** (s["low"] + h % (s["high"] - s["low"] + 1))
        elif kind == "prod":  # the special member takes turns among those the active group has
            size = (self.nranks - terms["group"] + s["G"] - 1) // s["G"]
            terms.update(special=(at // s["G"]) % size, m=3 + h % (s["M"] - 2))
        elif kind == "extreme":
            # g neighbouring codebook entries from a random base, rotated among the members
            # one step each time their group is active: the result varies and every member
            # holds it once in g of its active elements (turning with `at` itself would tie
            # the turn to the group wherever G and g share a factor: at 1024 ranks each
            # group's extreme would stay with one member)
            terms.update(base=1 + (h // s["g"]) % (s["K"] - s["g"]), turn=(at // s["G"]) % s["g"],
                         book=_codebook_tensor(self.dtype, str(idx.device)))
        elif kind == "add":
            terms["turn"] = h % s["U"]
        else:
            # integer avg: members 1.. give 1..g with the sign of the element's average t;
            # member 0, larger than any of them, what makes the group's sum n * t, so the
            # truncating average is exactly t
            mean = self._mean(h)
            terms.update(sign=mean.sign(), turn=h % s["g"])
            others = 0
            for member in range(1, s["g"]):
                present = terms["group"] + member * s["G"] < self.nranks
                others = others + present * (1 + (member - 1 + terms["turn"]) % s["g"])
            terms["first"] = self.nranks * mean - others * terms["sign"]
        return terms

    def _member_value(self, member, terms):
        """What member `member` (int or tensor) of the active group contributes."""
        import torch

        s = self._scheme
        kind = s["kind"]
        if kind == "average":
            return terms["value"]
        if kind == "prod":
            return torch.where(member == terms["special"], terms["m"], 2)
        if kind == "extreme":
            at = terms["base"] + _wrap(member + terms["turn"], s["g"])
            return terms["book"][at] if self.op == "max" else terms["book"][s["K"] - 1 - at]
        if kind == "add":
            return 1 + _wrap(member + terms["turn"], s["U"])
        others = terms["sign"] * (1 + _wrap(member - 1 + terms["turn"], s["g"]))
        if isinstance(member, int):
            return terms["first"] if member == 0 else others
        return torch.where(member == 0, terms["first"], others)

    def _mean(self, h):
        """integer avg: the average t at each element, |t| >= t_min, either sign where the type has one."""
        import torch

        s = self._scheme
        pick = (h // s["g"]) % (s["positive"] + s["negative"])
        return torch.where(pick < s["positive"], s["t_min"] + pick, -(max(s["t_min"], 2) + pick - s["positive"]))

    # ---- the exact result -------------------------------------------------------------
    def reduce(self, idx, without=()):
        """Exact reduction of every rank's input at `idx` (int64; avg on floats float64),
        leaving out the contributions of the ranks in `without` (to simulate a fault; avg
        still divides by nranks, as NCCL would)."""
        import torch

        s = self._scheme
        if s["kind"] == "move":
            raise ValueError("data-movement patterns have no reduction")
        n, terms = self.nranks, self._terms(idx)
        gone = torch.tensor(sorted(without), dtype=torch.int64, device=idx.device) if without else None
        acc = None
        for member in range(s["g"]):  # only the active group's members differ from the identity
            place = terms["group"] + member * s["G"]
            present = place < n
            if gone is not None or self.op == "mulsum":
                rank = self.unpermuted(place)
            if gone is not None:
                present &= ~torch.isin(rank, gone)
            v = self._member_value(member, terms)
            if self.op == "mulsum":
                v = v * (2 - rank % 2)  # premul_scalar of each member, as a tensor
            v = torch.where(present, v, self._identity())
            acc = v if acc is None else _combine(acc, v, self.op)
        if self.op == "avg":  # NCCL's integer average truncates toward zero
            return acc.double() / n if self.dtype.is_float else torch.div(acc, n, rounding_mode="trunc")
        return acc


def _wrap(value, modulus: int):
    """value % modulus for 0 <= value < 2 * modulus, without an integer division (this
    runs once per group member on every checked element)."""
    return value - modulus * (value >= modulus)


def _finfo(dtype: DType):
    import torch

    return torch.finfo(dtype.torch_dtype())


def _result_limit(dtype: DType) -> int:
    """The largest result a reduction may reach: the type's exact limit, less one where
    that is the poison pattern (uint8's 255)."""
    full = 2 ** (8 * dtype.itemsize) - 1
    return dtype.exact_limit - (1 if not dtype.is_float and dtype.exact_limit == full else 0)


def _integer_mean(n: int, dtype: DType) -> tuple[int, int, int, int] | None:
    """integer avg: (g, t_min, how many positive and negative averages t) with the largest
    group that leaves at least two values of t (one if nothing more fits); None when the
    type cannot hold n times any non-zero average (8-bit integers at many ranks)."""
    high = _result_limit(dtype)
    low = min(high + 1, 2 ** (8 * dtype.itemsize - 1)) if dtype.name.startswith("int") else 0
    for wanted in (2, 1):
        for g in range(min(n, GROUP_MAX), 0, -1):
            t_min = g * g // n + 1  # member 0 then exceeds every other member
            # t = -1 would read as the poison (all ones) in a signed type: negatives start at -2
            positive, negative = max(0, high // n - t_min + 1), max(0, low // n - max(t_min, 2) + 1)
            if positive + negative >= wanted:
                return g, t_min, positive, negative
    return None


def _digits(n: int, k: int) -> int:
    digits = 1
    while k ** digits < n:
        digits += 1
    return digits


def _combine(acc, v, op: str):
    import torch

    if op == "prod":
        return acc * v
    if op == "min":
        return torch.minimum(acc, v)
    if op == "max":
        return torch.maximum(acc, v)
    return acc + v


def bit_view(tensor, dtype: DType):
    import torch

    return tensor.view(getattr(torch, dtype.signed_view))


def poison(tensor, dtype: DType) -> None:
    """Fill with all-ones bits (NaN in floats): no codebook entry and no exact result has
    them, so an element nobody wrote is always counted wrong."""
    bit_view(tensor, dtype).fill_(-1)


def average_tolerance(expected, dtype: DType):
    """2 ulps of each expected value in `dtype` (nccl-tests' tolerance for avg), at least
    2 steps of the type's subnormal spacing."""
    import torch

    info = _finfo(dtype)
    _, exponent = torch.frexp(expected.abs())
    step = torch.ldexp(torch.full_like(expected, info.eps), (exponent - 1).to(expected.dtype))
    return 2 * step.clamp(min=info.smallest_normal * info.eps)


def count_mismatches(actual, expected_values, dtype: DType, op: str | None) -> int:
    """Number of elements of `actual` that differ from the exact `expected_values`
    (`op`: the pattern's reduction, None for data movement)."""
    if actual.numel() == 0:
        return 0
    if op == "avg" and dtype.is_float:
        # NCCL multiplies each input by 1/n in the type: a rounding or two, never more
        got, exp = _as_float64(actual, dtype), expected_values.double()
        return int((~((got - exp).abs() <= average_tolerance(exp, dtype))).sum().item())  # NaN counts
    exp_bits = bit_view(to_dtype(expected_values, dtype), dtype)
    return int((bit_view(actual, dtype) != exp_bits).sum().item())


def _as_float64(tensor, dtype: DType):
    if dtype.is_float and dtype.itemsize == 1:
        return tensor.float().double()
    return tensor.double()
