"""A tuner config that is safe to deploy with NCCL's example plugin: every size of every tuned
collective matched by a row, NCCL's own choice where nothing won, never one channel.

The plugin's rules these tests hold the rows to (plugins/tuner/example/plugin.c, NCCL 2.30):
the first row that matches wins; with no match, or a row's -1, the call runs on one channel;
a row's 0 is passed on and NCCL (src/enqueue.cc) keeps its own count."""

import pytest

from ncclbench.tune import analysis, coverage, nccl_log
from ncclbench.tune.files import MAX_BYTES, ConfigRow, config_text, read_config
from ncclbench.tune.plan import COLLECTIVES

PRE = "gpu-host:4242:4242 [0] NCCL INFO "
# all_reduce on 8 ranks, float: NCCL's choices as its TUNING lines print them (bytes of one rank's count)
CHOICES = {1024: ("TREE", "LL", 1), 4096: ("TREE", "LL", 2), 16384: ("RING", "LL", 4), 65536: ("RING", "LL", 8),
           262144: ("RING", "LL128", 16), 1 << 20: ("RING", "LL128", 24), 1 << 22: ("RING", "SIMPLE", 24),
           1 << 24: ("RING", "SIMPLE", 24)}


def _log(function, choices, per_rank_divisor=1):
    return nccl_log.parse_log("\n".join(
        f"{PRE}{function}: {size // per_rank_divisor} Bytes -> Algo {a} proto {p} channel{{Lo..Hi}}={{0..{ch - 1}}}"
        for size, (a, p, ch) in choices.items()))


def _choices(collective, choices, nranks=8):
    """{printed size: setting} as tune reads them: the TUNING log's bytes through the count
    of each printed row (all_gather and reduce_scatter: one rank's share)."""
    divisor = nranks if collective in ("all_gather", "reduce_scatter") else 1
    log = _log(COLLECTIVES[collective][1], choices, divisor)
    measured = analysis.Measured(log_bytes={s: s // divisor for s in choices})
    return analysis.choices_by_printed_size(log.choices, collective, measured)


def _assert_partition(rows):
    """The rows, in order, cover 0..MAX_BYTES with no gap and no overlap."""
    assert rows[0].min_bytes == 0 and rows[-1].max_bytes == MAX_BYTES
    for a, b in zip(rows, rows[1:]):
        assert b.min_bytes == a.max_bytes + 1, (a.text(), b.text())
    assert sum(r.max_bytes - r.min_bytes + 1 for r in rows) == MAX_BYTES + 1


@pytest.mark.parametrize("collective", list(COLLECTIVES))
def test_nccls_choice_covers_every_size_of_every_collective(collective):
    name = COLLECTIVES[collective][0]
    rows = coverage.nccl_choice_rows(name, _choices(collective, CHOICES), 1, 8)
    _assert_partition(rows)
    assert coverage.gaps(rows, name, 1, 8) == []
    for pipe_ops, reg_buff in ((1, 0), (1, 1), (4, 0), (2, 1)):
        assert coverage.gaps(rows, name, 1, 8, pipe_ops, reg_buff) == []
    # consecutive sizes with the same algorithm and protocol are one row; channels are NCCL's own
    assert [(r.algorithm, r.protocol, r.channels) for r in rows] == [
        ("tree", "ll", 0), ("ring", "ll", 0), ("ring", "ll128", 0), ("ring", "simple", 0)]
    assert all(r.collective == name and (r.nnodes, r.nranks) == (1, 8) for r in rows)
    # the boundaries: halfway between measured sizes
    assert [r.max_bytes for r in rows[:-1]] == [(4096 + 16384) // 2, (65536 + 262144) // 2, ((1 << 20) + (1 << 22)) // 2]


def test_each_measured_size_gets_the_choice_nccl_made_there():
    """Read through the plugin: at each measured size and between them, the row applied is
    NCCL's algorithm/protocol at the nearest measured size (ties to the smaller)."""
    choices = _choices("all_reduce", CHOICES)
    rows = coverage.nccl_choice_rows("allreduce", choices, 1, 8)
    for size, (algo, proto, _ch) in choices.items():
        row = coverage.first_match(rows, "allreduce", size, 1, 8)
        assert (row.algorithm, row.protocol) == (algo, proto)
    assert coverage.first_match(rows, "allreduce", 10240, 1, 8).algorithm == "tree"   # 10K: halfway 4K..16K
    assert coverage.first_match(rows, "allreduce", 10241, 1, 8).algorithm == "ring"


def test_all_gather_rows_are_in_the_plugins_bytes():
    """NCCL hands the plugin nRanks x count bytes for all_gather (ncclFuncMaxSendRecvCount),
    the printed size, while its TUNING line prints one rank's count: the rows use the former."""
    choices = _choices("all_gather", {1 << 24: ("RING", "SIMPLE", 24), 1 << 20: ("RING", "LL128", 16)})
    assert choices == {1 << 24: ("ring", "simple", 24), 1 << 20: ("ring", "ll128", 16)}
    rows = coverage.nccl_choice_rows("allgather", choices, 1, 8)
    assert coverage.first_match(rows, "allgather", 1 << 24, 1, 8).protocol == "simple"
    assert coverage.first_match(rows, "allgather", 1 << 20, 1, 8).protocol == "ll128"


def test_above_the_largest_measured_size_nccls_choice_there_goes_on_never_one_channel():
    rows = coverage.nccl_choice_rows("allreduce", _choices("all_reduce", CHOICES), 1, 8)
    top = coverage.first_match(rows, "allreduce", MAX_BYTES, 1, 8)
    assert top is rows[-1] and (top.algorithm, top.protocol) == ("ring", "simple")
    assert coverage.first_match(rows, "allreduce", (1 << 24) + 1, 1, 8) is top
    assert all(r.channels == coverage.NCCL_OWN_CHANNELS == 0 for r in rows)
    assert coverage.one_channel_rows(rows) == []


@pytest.mark.parametrize("broken,where", [
    ({4096: None}, "4K"),                                   # no TUNING line at that size
    ({16384: (None, None, 16)}, "16K"),                     # a symmetric kernel: no algorithm/protocol
    ({65536: ("ring", None, None)}, "64K"),                 # an unknown protocol name
])
def test_an_unknown_choice_at_a_measured_size_refuses(broken, where):
    choices = {**_choices("all_reduce", CHOICES), **broken}
    with pytest.raises(coverage.UnknownChoice, match=f"allreduce: NCCL's choice is not in its TUNING log at {where}$"):
        coverage.nccl_choice_rows("allreduce", choices, 1, 8)
    with pytest.raises(coverage.UnknownChoice, match="allreduce: nothing was measured"):
        coverage.nccl_choice_rows("allreduce", {}, 1, 8)


def test_win_rows_first_then_nccls_choice_every_call_gets_exactly_one_row():
    """The plugin's first match, at every boundary and one byte either side: single calls on
    unregistered buffers (what was measured) get the win inside its range and NCCL's choice
    elsewhere; every other kind of call gets NCCL's choice."""
    own = coverage.nccl_choice_rows("allreduce", _choices("all_reduce", CHOICES), 1, 8)
    win = ConfigRow("allreduce", 40961, 163840, "tree", "ll", 0, 1, 8, 1, 0)
    rows = [win, *own]
    edges = sorted({x + d for r in rows for x in (r.min_bytes, r.max_bytes) for d in (-1, 0, 1) if 0 <= x + d <= MAX_BYTES})
    for size in edges:
        got = coverage.first_match(rows, "allreduce", size, 1, 8)
        expected = win if win.min_bytes <= size <= win.max_bytes else next(
            r for r in own if r.min_bytes <= size <= r.max_bytes)
        assert got is expected, size
        for pipe_ops, reg_buff in ((1, 1), (2, 0)):
            assert coverage.first_match(rows, "allreduce", size, 1, 8, pipe_ops, reg_buff) in own
    assert coverage.first_match(rows, "allreduce", 1024, 1, 4) is None         # another communicator size
    assert coverage.first_match(rows, "allgather", 1024, 1, 8) is None         # another collective


def test_a_call_nccl_cannot_run_the_rows_pair_for_reaches_ring_simple_not_one_channel():
    """NVLS reduces only some datatypes and ops: for a bf16 or avg call in a job tuned on
    float sum, NCCL marks nvls/simple unusable, the plugin skips the row and tries the next."""
    own = coverage.nccl_choice_rows("allreduce", {1 << 20: ("nvls", "simple", 16)}, 1, 8)
    rows = own + coverage.fallback_rows("allreduce", 1, 8, own)
    assert rows[-1].text() == f"allreduce,0,{MAX_BYTES},ring,simple,0,1,8" and rows[-1].role == "fallback"
    assert coverage.first_match(own, "allreduce", 1 << 20, 1, 8, unusable={("nvls", "simple")}) is None
    for size in (0, 1 << 20, MAX_BYTES):
        assert coverage.first_match(rows, "allreduce", size, 1, 8, unusable={("nvls", "simple")}) is rows[-1]
        assert coverage.first_match(rows, "allreduce", size, 1, 8) is own[0]
    # where NCCL's own choice is ring/simple at every size, the row is there already
    ring = coverage.nccl_choice_rows("allreduce", {1 << 20: ("ring", "simple", 16)}, 1, 8)
    assert coverage.fallback_rows("allreduce", 1, 8, ring) == []


def test_gaps_are_the_sizes_the_plugin_would_run_on_one_channel():
    rows = [ConfigRow("allreduce", 100, 200, "ring", "ll", 0, 1, 8), ConfigRow("allreduce", 150, 300, "ring", "ll", 0, 1, 8),
            ConfigRow("allreduce", 500, MAX_BYTES - 1, "ring", "ll", 0, 1, 8, 1, 0)]
    assert coverage.gaps(rows, "allreduce", 1, 8) == [(0, 99), (301, 499), (MAX_BYTES, MAX_BYTES)]
    assert coverage.gaps(rows, "allreduce", 1, 8, 1, 1) == [(0, 99), (301, MAX_BYTES)]
    assert coverage.gaps(rows, "allreduce", 2, 8) == [(0, MAX_BYTES)]


def test_the_largest_size_and_long_comments_survive_the_plugins_reader(tmp_path):
    """max_bytes 2^64-1 reads back (strtoull into size_t); a comment is cut into lines the
    plugin reads whole (it reads 255 characters at a time: the rest of a longer comment
    would be a line not starting with '#')."""
    rows = coverage.nccl_choice_rows("allreduce", _choices("all_reduce", CHOICES), 1, 8)
    path = tmp_path / "c.conf"
    path.write_text(config_text(rows, ["x" * 40 + " word" * 120, ""]))
    lines = path.read_text().splitlines()
    assert all(len(line) < 255 for line in lines) and all(line.startswith("#") for line in lines[:-len(rows)])
    assert [r.text() for r in read_config(str(path))] == [r.text() for r in rows]
    path.write_text("# " + "x" * 300 + "\nallreduce,0,100,ring,ll,0,1,8\n")
    with pytest.raises(ValueError, match="line 1: longer than the plugin's 255 characters"):
        read_config(str(path))
    path.write_text(f"allreduce,0,{MAX_BYTES + 1},ring,ll,0,1,8\n")
    with pytest.raises(ValueError, match="max_bytes 18446744073709551616 is outside"):
        read_config(str(path))
