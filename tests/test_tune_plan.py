"""tune's combination plan: what each collective can be forced to, and what is refused."""

import pytest

from ncclbench.tune.plan import (DEFAULT, MAX_CHANNELS, Combination, Context, candidates, parse_channels,
                                 parse_names, unsupported_collective)


def labels(plan):
    return [c.label for c in plan.combos]


def test_all_reduce_on_one_node_of_eight():
    """Tree and Ring with every protocol, NVLS with Simple; NVLS_TREE (one node) and CollNet
    (no network) left out, each with its reason."""
    plan = candidates("all_reduce", Context(8, 1))
    assert labels(plan) == ["tree/ll", "tree/ll128", "tree/simple", "ring/ll", "ring/ll128", "ring/simple",
                            "nvls/simple"]
    why = dict(plan.left_out)
    assert set(why) == {"collnet_direct", "collnet_chain", "nvls_tree"}
    assert "single node" in why["nvls_tree"]


@pytest.mark.parametrize("coll,expected", [
    ("broadcast", ["ring/ll", "ring/ll128", "ring/simple"]),
    ("reduce", ["ring/ll", "ring/ll128", "ring/simple"]),
    ("all_gather", ["ring/ll", "ring/ll128", "ring/simple", "nvls/simple"]),
    ("reduce_scatter", ["ring/ll", "ring/ll128", "ring/simple", "nvls/simple"]),
])
def test_each_collective_gets_only_its_nccl_algorithms(coll, expected):
    plan = candidates(coll, Context(4, 1))
    assert labels(plan) == expected
    if coll in ("all_gather", "reduce_scatter"):  # PAT: one GPU per node only
        assert "one GPU per node" in dict(plan.left_out)["pat"]


def test_nvls_left_out_when_the_environment_disables_it():
    plan = candidates("all_reduce", Context(8, 1, {"NCCL_NVLS_ENABLE": "0"}))
    assert "nvls/simple" not in labels(plan)
    assert dict(plan.left_out)["nvls"] == "NCCL_NVLS_ENABLE=0 is set in the environment"


def test_multi_node_keeps_nvls_tree_and_pat_with_one_gpu_per_node():
    plan = candidates("all_reduce", Context(16, 2, {"NCCL_COLLNET_ENABLE": "1"}))
    assert {"nvls_tree/simple", "collnet_direct/simple", "collnet_chain/simple"} <= set(labels(plan))
    plan = candidates("all_gather", Context(4, 4))
    assert "pat/simple" in labels(plan)
    plan = candidates("reduce_scatter", Context(4, 4, op="avg"))
    assert "pat/simple" not in labels(plan) and "avg" in dict(plan.left_out)["pat"]


def test_one_rank_has_no_combination_and_says_why():
    plan = candidates("all_reduce", Context(1, 1))
    assert plan.combos == []
    assert "chooses no algorithm or protocol" in plan.left_out[0][1]


def test_restrictions_and_channel_limits_cross():
    plan = candidates("all_reduce", Context(8, 1), algos=("ring", "tree"), protos=("simple",), channels=(8, 16))
    assert labels(plan) == ["tree/simple", "tree/simple ch8", "tree/simple ch16", "ring/simple",
                            "ring/simple ch8", "ring/simple ch16"]
    assert plan.combos[1].environment() == {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}
    assert plan.combos[1].file_key == "tree-simple-ch8"


def test_restriction_naming_nothing_of_the_collective_is_refused():
    with pytest.raises(ValueError, match="none is an NCCL all_gather algorithm"):
        candidates("all_gather", Context(8, 1), algos=("tree",))
    with pytest.raises(ValueError, match="none is an NCCL broadcast algorithm"):
        candidates("broadcast", Context(8, 1), algos=("nvls",))
    plan = candidates("all_gather", Context(8, 1), algos=("tree", "ring"))
    assert dict(plan.left_out)["tree"] == "not an NCCL all_gather algorithm"


def test_nvls_with_a_protocol_it_does_not_have_is_refused():
    with pytest.raises(ValueError, match="for the algorithms asked"):
        candidates("all_reduce", Context(8, 1), algos=("nvls",), protos=("ll",))


@pytest.mark.parametrize("coll", ["alltoall", "sendrecv", "gather", "scatter", "alltoallv", "hypercube"])
def test_point_to_point_collectives_cannot_be_tuned(coll):
    assert "point-to-point" in unsupported_collective(coll)
    with pytest.raises(ValueError):
        candidates(coll, Context(8, 1))


def test_names_in_every_spelling_nccl_uses():
    assert parse_names("NVLSTree,nvls_tree,Ring, TREE", "algorithm") == ("nvls_tree", "ring", "tree")
    assert parse_names("CollNetDirect,collnet_chain", "algorithm") == ("collnet_direct", "collnet_chain")
    assert parse_names("Simple,LL128,ll", "protocol") == ("simple", "ll128", "ll")
    assert parse_names(None, "protocol") is None


@pytest.mark.parametrize("text,kind", [("trees", "algorithm"), ("ring,,tree", "algorithm"), ("", "protocol"),
                                       ("LL64", "protocol"), ("simple,rings", "algorithm")])
def test_unknown_names_are_refused(text, kind):
    with pytest.raises(ValueError):
        parse_names(text, kind)


def test_channel_lists():
    assert parse_channels("8, 16,32") == (8, 16, 32)
    assert parse_channels(None) == ()
    for bad in ("0", "65", "8,8", "8,x", "", "4.5", "-1"):
        with pytest.raises(ValueError):
            parse_channels(bad)
    assert parse_channels(str(MAX_CHANNELS)) == (64,)


def test_default_forces_nothing():
    assert DEFAULT.is_default and DEFAULT.label == "default"
    assert DEFAULT.environment() == {"NCCL_ALGO": None, "NCCL_PROTO": None}
    assert Combination.from_dict(Combination("ring", "ll", 4).to_dict()) == Combination("ring", "ll", 4)
