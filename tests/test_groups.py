"""ncclbench.engine.groups: NCCL_TESTS_SPLIT read and applied as nccl-tests does."""

import pytest

from ncclbench.engine.groups import SplitSpec, parse_split, split_color, split_groups, split_spec_from_environ


@pytest.mark.parametrize("spec, rank, color", [
    ("MOD 8", 13, 5),
    ("DIV 8", 13, 1),
    ("AND 0x7", 13, 5),
    ("OR 0x8", 5, 13),
    ("mod 8", 13, 5),
    ("%8", 13, 5),
    ("/ 4", 13, 3),
    ("& 0b110", 13, 4),
    ("| 0o1", 4, 5),
    ("AND 0x0", 13, 0),
    ("  DIV   2  ", 7, 3),
])
def test_split_color(spec, rank, color):
    assert split_color(rank, spec) == color


def test_split_groups_like_nccl_tests():
    # 2 nodes x 8 GPUs, "MOD 8": 8 groups, each one GPU per node (network-only traffic).
    assert split_groups(16, "MOD 8") == {c: [c, c + 8] for c in range(8)}
    assert split_groups(16, "DIV 8") == {0: list(range(8)), 1: list(range(8, 16))}
    assert split_groups(16, "AND 0x7") == split_groups(16, "MOD 8")
    assert split_groups(4, "AND 0") == {0: [0, 1, 2, 3]}


def test_parse_split_result():
    assert parse_split("and 0x7") == SplitSpec("AND", 7)
    assert str(parse_split("MOD 8")) == "MOD 8"
    assert split_color(9, SplitSpec("DIV", 4)) == 2


@pytest.mark.parametrize("spec, fragment", [
    ("", "expected '<AND|OR|MOD|DIV> <value>'"),
    ("MOD", "expected"),
    ("XOR 3", "expected"),
    ("MOD 8 9", "expected"),
    ("MOD 0", "divides by zero"),
    ("DIV 0x0", "divides by zero"),
    ("MOD -1", "not a non-negative integer"),
    ("AND 0xZZ", "not a non-negative integer"),
    ("MOD 08", "ambiguous"),
])
def test_parse_split_rejects(spec, fragment):
    with pytest.raises(ValueError, match=fragment) as caught:
        parse_split(spec)
    assert repr(spec) in str(caught.value)


def test_split_rejects_negative_rank():
    with pytest.raises(ValueError):
        split_color(-1, "MOD 8")


def test_split_spec_from_environ():
    assert split_spec_from_environ({}) is None
    assert split_spec_from_environ({"NCCL_TESTS_SPLIT": "DIV 8"}) == SplitSpec("DIV", 8)
    # As in nccl-tests: the mask is hex with or without 0x, and wins over NCCL_TESTS_SPLIT.
    assert split_spec_from_environ({"NCCL_TESTS_SPLIT_MASK": "7", "NCCL_TESTS_SPLIT": "DIV 8"}) == SplitSpec("AND", 7)
    assert split_spec_from_environ({"NCCL_TESTS_SPLIT_MASK": "0x10"}) == SplitSpec("AND", 16)
    with pytest.raises(ValueError, match="NCCL_TESTS_SPLIT"):
        split_spec_from_environ({"NCCL_TESTS_SPLIT": "MOD zero"})
