"""bench/bench_scale.py's method (issue 17): the telemetry pipeline is waited for between batches,
so its backlog is not charged to the next cache's batch; the writer can be paused for a batch;
a control cache shows what the method reads where there is no cost. Tiny runs, real telemetry
(writer process, SQLite store)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import scale_probes  # noqa: E402
import scale_run  # noqa: E402


def _stored_ops(store: str) -> int:
    con = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return int(con.execute("SELECT count(*) FROM ops").fetchone()[0])
    finally:
        con.close()


def _stopped(pid: int) -> bool:
    return scale_probes.process_state(pid) == "T"


def test_a_quiesced_batch_leaves_nothing_for_the_next_one_and_a_paused_writer_resumes(tmp_path):
    """Every cache call is one op in the store: after the fill and after a quiesced batch the
    store holds them all (nothing left to run on into the next batch); a batch run with
    ``quiesce=False`` leaves its backlog, which ``quiesce`` then drains. A paused writer is
    stopped while its batch runs and running again after."""
    r = scale_run.Run("telemetry", 1000, ("full",), True, str(tmp_path), False)
    writer = r.tel.pipeline.transport.process
    try:
        assert _stored_ops(r.store) == r.ops  # the fill's records, all stored
        seen = []
        real = r._timed_batch

        def timed(requests):
            seen.append(_stopped(writer.pid))
            real(requests)

        r._timed_batch = timed
        r.batch(20, pause_writer=True)
        assert seen == [True]
        faults = r.batches[-1]["writer_faults"]  # the writer's, from its flush's stats
        assert type(faults) is int and faults >= 0
        deadline = time.monotonic() + 5
        while _stopped(writer.pid) and time.monotonic() < deadline:  # (SIGCONT lands async)
            time.sleep(0.001)
        assert not _stopped(writer.pid)
        assert _stored_ops(r.store) == r.ops
        scale_probes.stop_process(writer.pid)  # (so no drain can store the backlog meanwhile)
        r.batch(20, quiesce=False)
        assert seen == [True, True] and _stored_ops(r.store) < r.ops
        os.kill(writer.pid, signal.SIGCONT)
        r.quiesce()
        assert _stored_ops(r.store) == r.ops
    finally:
        os.kill(writer.pid, signal.SIGCONT)
        r.close()


def test_the_bench_prints_the_control_and_flags_a_paused_writer():
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_scale.py"), "--scale", "1k", "--requests", "30",
         "--reps", "2", "--control", "--pause-writer"],
        capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "control's cost" in out.stdout and "telemetry's cost in ops/s" in out.stdout
    assert out.stdout.count("page faults of the cache's thread a batch: median") == 3
    assert "telemetry's cost against the control" in out.stdout
    assert "the telemetry row above is not the target's measure" in out.stdout


def test_a_held_pipeline_ships_nothing_during_its_batch_and_everything_after(tmp_path):
    """``Run.hold``: with a recorder that wakes its drain thread every 8 records, a held batch
    runs no drain cycle and the store gains nothing (the batch's records wait in the
    recorder); released, the recorder's own settings are back, a quiesce stores every op, and
    the next batch ships while it runs."""
    r = scale_run.Run("telemetry", 1000, ("full",), True, str(tmp_path), False)
    pipe, rec = r.tel.pipeline, r.tel.recorder
    try:
        assert _stored_ops(r.store) == r.ops
        rec.encode_batch = 8
        stored = r.ops
        r.hold(True)
        assert pipe.interval_s == scale_run.HELD_INTERVAL_S and rec.encode_batch == scale_run.HELD_BATCH
        cycles = pipe.cycles
        r.batch(60, quiesce=False)
        time.sleep(0.2)  # past the drain thread's own period
        assert pipe.cycles == cycles and _stored_ops(r.store) == stored < r.ops
        r.hold(False)
        assert pipe.interval_s == 0.1 and rec.encode_batch == 8
        r.quiesce()
        assert _stored_ops(r.store) == r.ops
        cycles = pipe.cycles
        r.batch(60, quiesce=False)
        assert pipe.cycles > cycles  # (woken every 8 records: many cycles in 360 records)
    finally:
        r.close()


def test_the_split_run_prints_both_modes_and_the_pipelines_share():
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_scale.py"), "--scale", "1k", "--requests", "30",
         "--reps", "2", "--split"],
        capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "telemetry's cost by pipeline mode, on one cache" in out.stdout
    assert "shipping: " in out.stdout and "held: " in out.stdout
    assert "the pipeline's share (drain thread, pipe, writer process)" in out.stdout
    assert "telemetry costs <= 5 % of ops/s" in out.stdout
    assert "the writer process's page faults a batch: median" in out.stdout
    bad = subprocess.run(
        [sys.executable, str(BENCH / "bench_scale.py"), "--split", "--control"],
        capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "--split takes none of" in bad.stderr


def test_a_hybrid_run_prints_the_full_only_targets_unjudged():
    """The request's 85 us and telemetry's 5 % are FULL's targets (the issue's workload, SGLang's
    classic cache): a run with SWA printed them as NOT met."""
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_scale.py"), "--scale", "1k", "--requests", "30",
         "--reps", "2", "--components", "full,swa"],
        capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    targets = out.stdout[out.stdout.index("issue 17 targets"):]
    assert "not judged: a target set on FULL alone" in targets
    for row in ("request with telemetry <= 85 us", "telemetry costs <= 5 % of ops/s"):
        line = next(x for x in targets.splitlines() if row in x)
        assert line.split()[:2] == ["not", "judged"], line
    assert "p99 <= 3x median, every op (telemetry)" in targets  # judged for every component set


def test_the_medians_interval_is_the_binomial_one():
    """The telemetry target is judged on a 95 % interval for the median of the batch pairs:
    the order statistics the binomial tables give (n = 12: the 3rd and 10th; 24: 7th and 18th;
    60: 22nd and 39th), min and max where n is too small for 95 %."""
    from scale_stats import median_ci

    for n, ranks in ((12, (3, 10)), (24, (7, 18)), (60, (22, 39)), (5, (1, 5)), (6, (1, 6)),
                     (1, (1, 1))):
        values = [float(i) for i in range(n, 0, -1)]  # given in any order
        assert median_ci(values) == ranks, n
    lo, hi = median_ci([0.01] * 11 + [0.3])  # an outlier pair moves neither end
    assert (lo, hi) == (0.01, 0.01)


def test_a_tail_the_machines_floor_explains_is_unsure_and_one_past_it_is_not_met():
    """p99 <= 3x median is judged against the machine too: an op over 3x whose p99 is within
    3x its median plus what fixed work of that median reads past its own median (the run's
    "floor") is unsure, one past that is NOT met, one under 3x is met; with no floor an op
    over 3x is NOT met, as before."""
    from scale_stats import floor_excess, tail_verdict

    floor = [(4.0, 6.0), (8.0, 20.0), (16.0, 22.0)]  # excess 2, 12, 6 us
    assert floor_excess(floor, 2.0) == 2.0 and floor_excess(floor, 40.0) == 6.0
    assert floor_excess(floor, 8.0) == 12.0
    assert abs(floor_excess(floor, 4 * 2 ** 0.5) - 7.0) < 1e-9  # halfway on a log scale
    ops = ["alloc", "request"]
    s = {"alloc": (8.0, 24.0), "request": (100.0, 200.0)}
    assert tail_verdict(s, ops, floor)[2] is True and tail_verdict(s, ops, None)[2] is True
    s["alloc"] = (8.0, 35.0)  # 3 x 8 + 12 = 36: within
    op, ratio, ok, note = tail_verdict(s, ops, floor)
    assert (op, ok) == ("alloc", None) and abs(ratio - 35 / 8) < 1e-9
    assert "alloc 35.0 us <= 3 x 8.0 + 12.0" in note
    s["alloc"] = (8.0, 37.0)
    assert tail_verdict(s, ops, floor)[2] is False
    s["alloc"], s["request"] = (8.0, 35.0), (100.0, 400.0)  # one op past its floor: NOT met
    assert tail_verdict(s, ops, floor)[2] is False
    s["request"] = (100.0, 200.0)
    assert tail_verdict(s, ops, None)[2] is False
    with pytest.raises(ValueError, match="no sizes"):
        floor_excess([], 1.0)


def test_a_floor_run_times_the_machines_floor_outside_its_cpu_and_no_other_run_does(tmp_path,
                                                                                   monkeypatch):
    """Between the requests of a floor run, two sizes of the fixed work a request in turn:
    every size gets its samples, their medians grow with the size, and the time they take is
    not charged to the batch. No other run times any (the fixed work slows the ops beside it),
    and a floor run takes no recorder."""
    import scale_probes as sp

    r = scale_run.Run("floor", 1000, ("full",), False, str(tmp_path), False, floor=True)
    r.batch(300)
    floor = r.summary()["floor"]
    assert len(floor) == len(sp.FLOOR_US), floor
    medians = [m for m, _ in floor]
    assert medians[-1] > 8 * medians[0] and all(p >= m for m, p in floor)
    sizes = [i for i, _ in r.batches[-1]["floor"]]
    assert len(sizes) == 600 and {sizes.count(i) for i in range(len(sp.FLOOR_US))} == {100}
    # the batch's CPU time is the ops': with the fixed work made 100x longer, far more than it
    monkeypatch.setattr(scale_run.FLOOR, "turns", [n * 100 for n in scale_run.FLOOR.turns])
    r.batch(20)
    long = r.batches[-1]
    assert long["cpu"] < 0.5 * sum(ns for _, ns in long["floor"]) / 1e9
    rate, median = sp.clock_jumps(0.05)
    assert rate >= 0 and median >= 0
    base = scale_run.Run("baseline", 1000, ("full",), False, str(tmp_path), False)
    base.batch(20)
    assert not base.batches[-1]["floor"] and base.summary()["floor"] == []
    with pytest.raises(ValueError, match="a floor run has no recorder"):
        scale_run.Run("floor", 1000, ("full",), True, str(tmp_path), False, floor=True)


def test_the_bench_judges_tails_on_its_floor_run_and_without_one_as_before():
    """The floor line and the machine's clock line are printed, and a p99 verdict is one of
    the three; ``--no-floor`` prints no floor and excuses no tail."""
    args = [sys.executable, str(BENCH / "bench_scale.py"), "--scale", "1k", "--requests", "120",
            "--reps", "3", "--no-telemetry"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "the machine: the thread's CPU clock jumped" in out.stdout
    line = next(x for x in out.stdout.splitlines() if "the machine's floor (fixed work" in x)
    assert len(line.split(": ")[1].split()) == 6, line
    verdict = next(x for x in out.stdout.splitlines() if "p99 <= 3x median" in x)
    assert verdict.split("p99")[0].strip() in ("met", "unsure", "NOT met"), verdict
    bare = subprocess.run(args + ["--no-floor"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert bare.returncode == 0, bare.stderr[-2000:]
    assert "the machine's floor (fixed work" not in bare.stdout
    assert "within the machine's floor" not in bare.stdout


def test_a_batch_starts_with_the_young_generations_empty(tmp_path, monkeypatch):
    """The collector's counts are the process's. Objects the other cache's batch left in the
    young generations must not trigger a collection inside this one (with a deterministic
    workload, generation-1 collections fell on the baseline's every other batch at 100 k
    nodes): at the batch's first request, neither young generation holds them."""
    import gc

    r = scale_run.Run("baseline", 1000, ("full",), False, str(tmp_path), False)
    before = gc.get_threshold()
    keep: list = []
    counts: list = []
    real = scale_run.one_request

    def first(*args):
        if not counts:
            counts.append(gc.get_count())
        return real(*args)

    monkeypatch.setattr(scale_run, "one_request", first)
    try:
        gc.set_threshold(1_000_000, 1_000, 1_000)
        gc.collect()
        keep.extend([] for _ in range(20_000))  # what the other cache's batch left
        assert gc.get_count()[0] >= 20_000
        r.batch(3)
        assert counts and counts[0][0] < 1_000 and counts[0][1] == 0, counts
    finally:
        gc.set_threshold(*before)
        keep.clear()


def test_bench_record_costs_drain_step_ships_every_record_with_no_writer(tmp_path):
    """``bench_record_cost.py``'s ``drain`` cache: its drain thread takes every record the cache
    makes (the fill's and a batch's: one per cache call) and ships it to a transport that drops
    it, so the step measures the drain thread with no writer process; ``close`` stops the
    thread."""
    import bench_record_cost as brc

    r = brc.DrainRun("drain", 1000, ("full",), str(tmp_path))
    try:
        assert r.pipeline.shipped == r.ops  # (quiesced after the fill)
        r.batch(20)
        assert r.pipeline.shipped == r.ops
        assert r.pipeline.recorder.queued == 0 and r.c.recorder is r.pipeline.recorder
        assert r.tel is None and r.store_size() == 0
    finally:
        r.close()
    assert not r.pipeline._thread.is_alive()


def test_bench_record_costs_pipe_step_ships_every_record_down_a_pipe_to_cat(tmp_path):
    """The ``pipe`` cache's drain thread frames every batch as the writer's transport does and
    writes it down the pipe (here to ``wc -c``, which counts what arrives: every blob, with the
    frames around them); nothing is dropped, and ``close`` ends the reader."""
    import bench_record_cost as brc

    transport = brc.CatTransport(("wc", "-c"), subprocess.PIPE)
    r = brc.DrainRun("pipe", 1000, ("full",), str(tmp_path), transport)
    try:
        assert r.pipeline.shipped == r.ops
        r.batch(20)
        assert r.pipeline.shipped == r.ops
        stats = r.pipeline.health.snapshot()
        assert not any(stats["dropped"].values()) and not stats["failures"], stats
        assert transport.process.poll() is None  # the reader is reading
    finally:
        r.close()
    assert transport.process.returncode == 0
    arrived = int(transport.process.stdout.read())
    transport.process.stdout.close()
    assert 0 < transport.blob_bytes < arrived < transport.blob_bytes + 64 * 1024


def test_bench_record_cost_prints_the_drain_and_writer_steps():
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_record_cost.py"), "--scale", "1k", "--requests", "30",
         "--reps", "2"],
        capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    for label in ("drain thread", "  pipe ", "writer", "pipeline", "cost (pairs)"):
        assert label in out.stdout, label
