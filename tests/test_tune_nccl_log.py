"""NCCL's debug lines: what it chose per call, where each communicator begins."""

from ncclbench.tune import analysis, nccl_log
from ncclbench.tune.analysis import ItemResult

# Real lines, with where they were published:
# NVIDIA/nccl docs/userguide/source/troubleshooting/logging.rst (master, 5067397c), NCCL >= 2.24 form
DOCS_LINE = "node-01:631871:631871 [0] NCCL INFO AllReduce: 33554432 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..31}"
# NVIDIA/nccl issue #1453 (NCCL 2.20-2.22 form, behind mpirun --tag-output's "[0] ")
ISSUE_1453 = "[0] h100clust-worker-1:497888:497888 [0] NCCL INFO 262144 Bytes -> Algo 0 proto 1 time 54.707825"
# NVIDIA/nccl issue #1595 (the same form, host prefix cut by the reporter)
ISSUE_1595 = "[0] NCCL INFO 805306368 Bytes -> Algo 1 proto 2 time 3970.683594"
# NVIDIA/nccl issue #1814: a communicator's end of init on one rank
INIT_1814 = ("hostname-test:980:1265 [0] NCCL INFO comm 0x55986b8b8560 rank 32 nranks 64 cudaDev 0 nvmlDev 0 "
             "busId 18000 commId 0x5ae77eb5ea4ec1ee - Init COMPLETE")
# Lines made from NCCL's own format strings (src/enqueue.cc of v2.28.9, line 741, and v2.27.7,
# line 1429; src/init.cc of v2.28.9, line 1593), for the forms no public log above shows
TREE_LL128 = "gpu-host:4242:4242 [0] NCCL INFO AllGather: 2097152 Bytes -> Algo TREE proto LL128 channel{Lo..Hi}={2..17}"
SYMMETRIC = ("gpu-host:4242:4242 [0] NCCL INFO AllReduce [Symmetric]: 1048576 Bytes -> Kernel AllReduce_AGxLL_R "
             "nchannels 16 nthreads 512")
TWO_23 = "gpu-host:4242:4242 [0] NCCL INFO ReduceScatter: 4096 Bytes -> Algo 6 proto 2 time 11.250000"
SPLIT_INIT = ("gpu-host:4242:4242 [0] NCCL INFO ncclCommSplit comm 0x5600 rank 0 nranks 8 cudaDev 0 nvmlDev 0 "
              "busId 18000 parent 0x5500 splitCount 1 color 0 key 0 - Init COMPLETE")


def test_choice_lines_in_each_form():
    c = nccl_log.parse_choice(DOCS_LINE)
    assert (c.function, c.nbytes, c.algo, c.proto, c.channels) == ("AllReduce", 33554432, "ring", "simple", 32)
    c = nccl_log.parse_choice(ISSUE_1453)
    assert (c.function, c.nbytes, c.algo, c.proto, c.channels) == (None, 262144, "tree", "ll128", None)
    c = nccl_log.parse_choice(ISSUE_1595)
    assert (c.nbytes, c.algo, c.proto) == (805306368, "ring", "simple")
    c = nccl_log.parse_choice(TREE_LL128)
    assert (c.function, c.algo, c.proto, c.channels, c.label) == ("AllGather", "tree", "ll128", 16, "tree/ll128 ch16")
    c = nccl_log.parse_choice(TWO_23)
    assert (c.function, c.algo, c.proto) == ("ReduceScatter", "pat", "simple")
    c = nccl_log.parse_choice(SYMMETRIC)
    assert (c.kernel, c.channels, c.algo) == ("AllReduce_AGxLL_R", 16, None)


def test_other_lines_are_not_choices():
    for line in (INIT_1814, "NCCL version 2.28.9+cuda13.0", "gpu-host:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Tree",
                 "gpu-host:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM", ""):
        assert nccl_log.parse_choice(line) is None


def _log(*lines):
    return nccl_log.parse_log("\n".join(lines))


def test_a_log_is_cut_at_each_communicator():
    log = _log("NCCL version 2.28.9+cuda13.0", INIT_1814, SPLIT_INIT, DOCS_LINE, DOCS_LINE, SPLIT_INIT,
               "gpu-host:4242:4242 [0] misc/strongstream.cc:1 NCCL WARN something odd", TREE_LL128,
               "gpu-host:4242:4242 [0] NCCL INFO TUNER/ExamplePlugin: Loaded 2 tuning configurations from /t/c.conf")
    assert log.version == "2.28.9"
    assert [len(c) for c in log.communicators] == [0, 2, 1]
    assert log.warnings == ["something odd"]
    assert log.plugin == ["TUNER/ExamplePlugin: Loaded 2 tuning configurations from /t/c.conf"]
    sizes = nccl_log.by_size(log.choices, "AllReduce")
    assert dict(sizes) == {33554432: {("ring", "simple", 32, None): 2}}


def test_attribution_needs_the_exact_number_of_communicators():
    log = _log(INIT_1814, SPLIT_INIT, DOCS_LINE, SPLIT_INIT, TREE_LL128)
    assert nccl_log.communicators_for(log, 1, 2)[1][1][0].algo == "tree"
    assert nccl_log.communicators_for(log, 0, 3)[0][1] == []
    assert nccl_log.communicators_for(log, 1, 1) is None          # one too many: no guessing
    assert nccl_log.communicators_for(log, 1, 1, trailing=1)[0][1][0].algo == "ring"
    assert nccl_log.communicators_for(log, 1, 3) is None


def test_items_get_their_own_communicators_choices(tmp_path):
    """Rank 0's log of one launch: the world communicator, then one per item that came up;
    an item refused at init has none and is skipped."""
    (tmp_path / "nccl.gpu-host.4242.log").write_text("\n".join([INIT_1814, SPLIT_INIT, DOCS_LINE, SPLIT_INIT,
                                                                 TREE_LL128]))
    items = [{"index": i} for i in range(3)]
    results = {0: ItemResult("ok", [], True, 4242), 1: ItemResult("refused", ["x"], False, 4242),
               2: ItemResult("ok", [], True, 4242)}
    logs = analysis.probe_logs(str(tmp_path))
    got = analysis.attribute_choices(items, results, logs, {4242: True})
    assert [c.algo for c in got[0][1]] == ["ring"] and [c.algo for c in got[2][1]] == ["tree"] and 1 not in got
    assert analysis.attribute_choices(items, results, logs, {4242: False}) == {}  # the counts disagree


def test_tuning_bytes_are_the_count_column_times_the_type_size():
    """all_gather at 8 ranks: printed size 16 MiB, count 524288 floats per rank: NCCL logs 2 MiB."""
    assert analysis.log_bytes(524288, "float") == 2097152
    choices = [nccl_log.parse_choice(TREE_LL128)]
    m = analysis.Measured(log_bytes={16777216: 2097152, 33554432: 4194304})
    assert analysis.choices_by_printed_size(choices, "all_gather", m) == {16777216: ("tree", "ll128", 16)}
    assert analysis.choices_by_printed_size(choices, "all_reduce", m) == {}  # another function's line


# NVIDIA/nccl issue #1814: a communicator's channel count, printed during its init
CHANNELS_1814 = ("hostname-test:983:1261 [3] NCCL INFO 16 coll channels, 0 collnet channels, 16 nvls channels, "
                 "16 p2p channels, 1 p2p channels per peer")
# src/graph/tuning.cc (v2.28.9, ncclTopoTuneModel): printed at each communicator's init when set
ALGO_SET = "gpu-host:4242:4242 [0] NCCL INFO NCCL_ALGO set by environment to Tree"
PROTO_SET = "gpu-host:4242:4242 [0] NCCL INFO NCCL_PROTO set by environment to LL"
FOUR_CHANNELS = CHANNELS_1814.replace("16 coll", "4 coll")


def test_each_communicators_init_says_what_it_read():
    """The proof, even on one rank (which logs no TUNING line), that NCCL read the forced
    setting again for each new communicator."""
    log = _log(CHANNELS_1814, INIT_1814, ALGO_SET, PROTO_SET, FOUR_CHANNELS, SPLIT_INIT, CHANNELS_1814, SPLIT_INIT)
    got = [(i.algo_env, i.proto_env, i.channels) for i in log.inits]
    assert got == [(None, None, 16), ("Tree", "LL", 4), (None, None, 16)]
    from ncclbench.tune.plan import DEFAULT, Combination

    assert analysis.init_text(Combination("tree", "ll", 4), log.inits[1]) == \
        "NCCL read NCCL_ALGO=Tree NCCL_PROTO=LL, 4 channel(s)"
    assert analysis.init_text(Combination("tree", "ll", 8), log.inits[1]).endswith("NOT what was set")
    assert analysis.init_text(Combination("ring", "ll"), log.inits[1]).endswith("NOT what was set")
    assert analysis.init_text(DEFAULT, log.inits[2]) == "NCCL read no NCCL_ALGO/NCCL_PROTO, 16 channel(s)"
    assert analysis.init_text(DEFAULT, None) == ""
