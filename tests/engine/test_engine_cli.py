"""The ``radixscope`` CLI: a real run in a subprocess writes a store that ``doctor`` and
``export`` read, request spans parent the cache's spans, and bad input gives one line on stderr
and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from radixscope.engine.cli import main, ui_app_path
from radixscope.telemetry import open_store

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--workload", "fewshot", "--requests", "20", "--device-tokens", "1024",
         "--host-tokens", "2048", "--swa-device-tokens", "512", "--swa-host-tokens", "1024",
         "--mamba-slots", "12", "--mamba-host-slots", "24", "--chunk-tokens", "64",
         "--prefill-budget", "128", "--max-running", "6"]


def radixscope(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "radixscope.engine.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    p = radixscope(["run", *SMALL, "--store", "runs/small.db", "--check-invariants"], d)
    assert p.returncode == 0, p.stderr
    return d, p


def test_run_prints_the_summary(run_dir):
    d, p = run_dir
    out = p.stdout.splitlines()
    device = "cuda" if torch.cuda.is_available() else "cpu"  # --device auto
    assert out[0] == "radixscope run: workload fewshot, preset hybrid (full+swa+mamba), " \
                     f"write_through, on {device}"
    assert out[1].startswith("  requests     20 finished, 0 rejected of 20; ")
    labels = [line[2:15].strip() for line in out if line.startswith("  ") and line[2] != " "]
    assert labels == ["requests", "time", "hit rate", "branching", "evictions", "backups",
                      "load-backs",
                      "op latency", "content", "budget", "invariants", "store"]
    assert "  invariants   ok (check() after every step)" in out
    assert [line.split()[0] for line in out[4:7]] == ["full", "swa", "mamba"]
    assert (d / "runs" / "small.db").is_file()
    assert p.stderr == ""  # no TTY: no progress bar


def test_doctor_reads_the_store(run_dir, capsys):
    d, _ = run_dir
    assert main(["doctor", str(d / "runs" / "small.db")]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].endswith("full+swa+mamba cache, page size 1, journal up to seq "
                                         + text.splitlines()[0].rsplit(" ", 1)[1])
    assert "  full/device: 1024 tokens = " in text and "  mamba/host: 24 states = " in text
    assert "violations: none recorded" in text
    assert "admissions: 20 admitted;" in text
    assert text.rstrip().endswith("verdict: healthy")


def test_request_spans_parent_cache_spans(run_dir):
    d, _ = run_dir
    with open_store(d / "runs" / "small.db") as r:
        spans = r.spans()
        events = r.events("admission")
    req = spans[spans["name"] == "text_completion standin-hybrid"]
    assert len(req) == 20
    a = req.iloc[0]["attributes"]
    assert a["gen_ai.operation.name"] == "text_completion"
    assert a["gen_ai.usage.input_tokens"] > a["gen_ai.usage.cache_read.input_tokens"] >= 0
    assert a["kv_cache.request.id"].startswith("fewshot-")
    by_span = dict(zip(req["span_id"], req["attributes"], strict=True))
    cache = spans[spans["name"].str.startswith("kv_cache.")]
    children = cache[cache["parent_span_id"].isin(by_span)]
    assert {"kv_cache.match", "kv_cache.alloc", "kv_cache.insert", "kv_cache.lock",
            "kv_cache.unlock"} <= set(children["name"])
    for parent, attrs in zip(children["parent_span_id"], children["attributes"], strict=True):
        assert attrs["kv_cache.request.id"] == by_span[parent]["kv_cache.request.id"]
    admitted = [e for e in events["attrs"] if e["admitted"]]
    assert len(admitted) >= 20
    assert set(admitted[0]["components"]) == {"full", "swa", "mamba"}


def test_export_perfetto(run_dir, capsys):
    d, _ = run_dir
    out = d / "trace.json"
    assert main(["export", str(d / "runs" / "small.db"), "--perfetto", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out} (")
    events = json.loads(out.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert any(e.get("name") == "text_completion standin-hybrid" for e in events)


def test_doctor_calls_an_all_rejected_run_a_problem(tmp_path, capsys):
    """Pools too small for every request: the run exits 1, and the doctor says the same, with
    the same first rejection, instead of "healthy"."""
    p = radixscope(["run", "--preset", "full", "--device-tokens", "256", "--requests", "20",
                    "--store", "runs/small.db"], tmp_path)
    assert p.returncode == 1
    said = p.stderr.splitlines()[-1]
    assert said == ("radixscope run: all 20 requests were rejected; the first, chat-0-0: "
                    "rejected: full needs 455 device tokens for its 455 prompt + output tokens "
                    "but the pool holds 256")
    assert main(["doctor", str(tmp_path / "runs" / "small.db")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "run: PROBLEM: " + said.removeprefix("radixscope run: ")
    assert lines[-1] == "verdict: PROBLEMS FOUND (see above)"


def test_doctor_does_not_call_a_run_stopped_by_a_fault_clean(tmp_path, capsys):
    """docs/zoo.md's command: the run stops on the injected fault with its store closed
    properly; the doctor says the store was closed, not that the run finished cleanly."""
    p = radixscope(["run", "--inject", "lock_evicted_segment", "--preset", "full",
                    "--load-back-threshold", "100000", "--device-tokens", "1024",
                    "--host-tokens", "2048", "--requests", "20", "--store", "runs/zoo.db"],
                   tmp_path)
    assert p.returncode == 1, p.stderr
    assert main(["doctor", str(tmp_path / "runs" / "zoo.db")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("run: the store was closed properly (telemetry closed at ")
    assert not any("cleanly" in line for line in lines)
    assert any(line.startswith("  [invariant] ") and "full.pin_without_device" in line
               for line in lines)
    assert lines[-1] == "verdict: PROBLEMS FOUND (see above)"


DAMAGED_JSON = {  # sql on a copy of a good store -> what the one error line names
    # an event's attrs: the store reader refuses them before the doctor walks them
    "event attrs a list": ("UPDATE events SET attrs = '[1]'", "events row id=1: attrs is"),
    "event attrs null": ("UPDATE events SET attrs = 'null'", "events row id=1: attrs is"),
    "stats a list": ("UPDATE info SET value = '[1]' WHERE key = 'stats'",
                     "info row key='stats' is a JSON array, expected a JSON object"),
    "stats.dropped a list": ("UPDATE info SET value = '{\"dropped\": [1]}' WHERE key = 'stats'",
                             'info["stats"]["dropped"] is list'),
    "stats.failures a number": ("UPDATE info SET value = '{\"failures\": 3}' "
                                "WHERE key = 'stats'", 'info["stats"]["failures"] is int'),
    "cache a list": ("UPDATE info SET value = '[1]' WHERE key = 'cache'",
                     'info["cache"] is list'),
}


@pytest.mark.parametrize("case", list(DAMAGED_JSON))
def test_doctor_on_json_of_the_wrong_shape_is_one_line(run_dir, tmp_path, capsys, case):
    import shutil
    import sqlite3

    from radixscope.engine.doctor import diagnose

    d, _ = run_dir
    sql, what = DAMAGED_JSON[case]
    bad = tmp_path / "bad.db"
    shutil.copy(d / "runs" / "small.db", bad)
    with sqlite3.connect(bad) as con:
        con.execute(sql)
    con.close()
    with pytest.raises(ValueError, match=re.escape(f"{str(bad)!r} is damaged or not a valid "
                                                   "radixscope store")):
        diagnose(str(bad))
    assert main(["doctor", str(bad)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("radixscope doctor: error: ") and what in err[0]
    assert str(bad) in err[0]


@pytest.mark.slow
def test_default_run_writes_runs_latest(tmp_path):
    p = radixscope(["run"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("radixscope run: workload chat, preset hybrid")
    assert (tmp_path / "runs" / "latest.db").is_file()
    assert main(["doctor", str(tmp_path / "runs" / "latest.db")]) == 0


def test_bad_input_in_a_subprocess_is_one_line(tmp_path):
    p = radixscope(["doctor", "nowhere.db"], tmp_path)
    assert p.returncode == 2
    assert p.stderr.splitlines() == ["radixscope doctor: error: no store at 'nowhere.db'"]
    assert "Traceback" not in p.stderr


@pytest.fixture()
def junk(tmp_path):
    f = tmp_path / "junk.db"
    f.write_bytes(b"this is not sqlite at all" * 100)
    return str(f)


@pytest.mark.parametrize("args,message", [
    (["run", "--workload", "nope", "--no-store"], "radixscope run: error: unknown workload "
     "'nope'; choose one of chat, agentic, fewshot, random, trace"),
    (["run", "--device-tokens", "-5"], "radixscope run: error: argument --device-tokens: -5 "
     "must be >= 1"),
    (["run", "--host-tokens", "-1"], "radixscope run: error: argument --host-tokens: -1 must be "
     ">= 0"),
    (["run", "--requests", "zero"], "radixscope run: error: argument --requests: 'zero' is not "
     "an integer"),
    (["run", "--components", "full,foo", "--no-store"], "radixscope run: error: "
     "components='full,foo': must be one of full, full,swa, full,mamba, full,swa,mamba"),
    (["run", "--preset", "swa", "--components", "full", "--no-store"], "radixscope run: error: "
     "--components full does not match --preset swa (components full,swa)"),
    (["run", "--preset", "big", "--no-store"], "radixscope run: error: unknown preset 'big'; "
     "choose one of full, hybrid, mamba, swa"),
    (["run", "--write-policy", "sometimes", "--no-store"], "radixscope run: error: argument "
     "--write-policy: invalid choice: 'sometimes' (choose from 'write_through', "
     "'write_through_selective', 'write_back')"),
    (["run", "--workload", "trace", "--no-store"], "radixscope run: error: workload 'trace' "
     "needs a trace file (--trace FILE)"),
    (["run", "--trace"], "radixscope run: error: argument --trace: expected one argument"),
    (["run", "--device", "tpu", "--no-store"], "radixscope run: error: argument --device: "
     "'tpu': must be auto, cpu, cuda or cuda:N"),
    (["run", "--inject", "lock_evicted_segment", "--device", "cuda", "--no-store"],
     "radixscope run: error: --inject runs on the CPU (its locating re-run must repeat the "
     "run), not on device='cuda': drop --device"),
])
def test_bad_run_input(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [message]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: --device cuda runs")
def test_run_on_cuda_without_cuda_is_one_line(capsys):
    assert main(["run", "--device", "cuda", "--no-store", "--requests", "2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["radixscope run: error: CacheConfig.device='cuda': CUDA is not available on "
                   "this machine"]


def test_unknown_command(capsys):
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1  # the list of choices is quoted differently across Python versions
    assert err[0].startswith("radixscope: error: argument command: invalid choice: "
                             "'frobnicate' (choose from ")


@pytest.mark.parametrize("command", ["doctor", "ui", "export"])
def test_missing_and_corrupt_stores(command, junk, tmp_path, capsys):
    extra = ["--perfetto", str(tmp_path / "t.json")] if command == "export" else []
    assert main([command, str(tmp_path / "missing.db"), *extra]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"radixscope {command}: error: no store at '{tmp_path / 'missing.db'}'"]
    assert main([command, junk, *extra]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"radixscope {command}: error: ") and \
        "is not a radixscope telemetry store" in err[0]


def test_run_refuses_to_overwrite_a_foreign_file(junk, capsys):
    assert main(["run", "--store", junk]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"radixscope run: error: --store {junk!r} exists and is not a radixscope store; "
        "refusing to overwrite it"]


def test_ui_entrypoint_is_found():
    assert ui_app_path() == ROOT / "ui" / "app.py"


def test_progress_bar_line():
    import io

    from radixscope.engine.progress import ProgressBar

    class Fake:
        done, rejected, running, waiting, step_no = [1] * 3, [1], [1, 2], [], 40
    out = io.StringIO()
    bar = ProgressBar(8, stream=out, enabled=True, width=8)
    bar(Fake())
    bar.close()
    assert out.getvalue() == "\r[####----] 4/8 requests | step 40 | 2 running, 0 waiting\n"
    quiet = io.StringIO()
    ProgressBar(8, stream=quiet)(Fake())  # not a terminal: draws nothing
    assert quiet.getvalue() == ""


def test_size_for_a_missing_component(capsys):
    assert main(["run", "--preset", "full", "--swa-device-tokens", "128", "--no-store"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "radixscope run: error: swa_device_tokens=128 is for the 'swa' component, which preset "
        "'full' does not have"]


def test_run_keeps_startup_objects_out_of_the_collectors_way_and_hands_them_back(
        tmp_path, monkeypatch, capsys):
    """``radixscope run`` freezes what exists before the run (torch and the imports) for the
    run's duration, then unfreezes it, unless the caller had frozen its own."""
    import gc

    from radixscope.engine import run as run_mod
    seen = []
    execute = run_mod.execute

    def watched(*args, **kw):
        seen.append(gc.get_freeze_count())
        return execute(*args, **kw)

    monkeypatch.setattr(run_mod, "execute", watched)
    monkeypatch.chdir(tmp_path)
    from radixscope.engine import cli
    # the interpreter's own (CPython 3.12.1 starts with 375 frozen; an earlier run in this
    # process thawed them) are no caller's choice
    assert gc.get_freeze_count() <= cli._STARTUP_FROZEN
    assert main(["run", *SMALL, "--no-store", "--no-progress"]) == 0
    assert seen[0] > 1000 and gc.get_freeze_count() == 0
    gc.freeze()  # a caller that froze its own objects: nothing more frozen, nothing thawed
    try:
        kept = gc.get_freeze_count()
        assert main(["run", *SMALL, "--no-store", "--no-progress"]) == 0
        # nothing more frozen for the run, nothing thawed after (frozen objects may still be
        # freed by reference count, so the count can only fall)
        assert seen[1] <= kept and 0 < gc.get_freeze_count() <= kept
    finally:
        gc.unfreeze()
    capsys.readouterr()


def test_a_page_size_alone_rounds_the_presets_token_pools_to_whole_pages(capsys):
    """``--page-size 3`` on its own runs: the preset's token pools (4,096 device, 16,384 host,
    2,048 / 8,192 SWA) are rounded down to whole pages; a pool the user set is taken as given
    (and refused when it is not whole pages, see test_engine_bad_input.py)."""
    from radixscope.engine.run import RunSpec

    c = RunSpec(sizes={"page_size": 3}).cache_config()
    assert (c.page_size, c.device_tokens, c.host_tokens, c.swa_device_tokens,
            c.swa_host_tokens) == (3, 4095, 16383, 2046, 8190)
    c = RunSpec(sizes={"page_size": 3, "host_tokens": 3000}).cache_config()
    assert (c.device_tokens, c.host_tokens) == (4095, 3000)
    assert RunSpec(sizes={"page_size": 8192}, preset="full").cache_config().device_tokens == 8192
    assert main(["run", "--workload", "fewshot", "--requests", "8", "--page-size", "3",
                 "--no-store", "--no-progress", "--check-invariants"]) == 0
    assert "invariants   ok" in capsys.readouterr().out


@pytest.mark.parametrize("storage", ["file:", "file:{file}", "file:/proc/radixscope-nope"])
def test_a_bad_storage_target_leaves_the_previous_store_alone(storage, tmp_path, capsys):
    """The L3 target is opened before the store is replaced: a bad one is one line naming it,
    and the previous run's store still reads."""
    store = str(tmp_path / "latest.db")
    assert main(["run", *SMALL, "--store", store, "--no-progress"]) == 0
    before = open_store(store).last_seq()
    assert before > 0
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    capsys.readouterr()
    assert main(["run", *SMALL, "--store", store, "--no-progress",
                 "--storage", storage.format(file=blocker)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "storage" in err, err
    assert open_store(store).last_seq() == before


def test_an_injection_that_never_fires_is_a_problem_not_a_clean_run(tmp_path, capsys):
    """``--inject`` is a demo: a run whose fault's buggy path was never reached says so and
    exits 1 rather than printing a clean summary with exit 0; strict checking is reported."""
    args = ["run", "--workload", "fewshot", "--requests", "3", "--no-store", "--no-progress",
            "--inject", "lock_evicted_segment"]
    assert main(args) == 1
    out, err = capsys.readouterr()
    assert "  invariants   ok (check() after every cache call)" in out.splitlines()
    assert err.splitlines() == ["radixscope run: --inject lock_evicted_segment never fired: "
                                "these settings do not reach its buggy path (docs/zoo.md gives "
                                "settings that do)"]


def test_a_run_that_rejects_every_request_says_why_and_fails(capsys):
    assert main(["run", "--device-tokens", "8", "--requests", "3", "--no-store",
                 "--no-progress"]) == 1
    out, err = capsys.readouterr()
    assert "0 finished, 3 rejected of 3" in out
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("radixscope run: all 3 requests were "
                                                   "rejected; the first, "), lines
    assert "but the pool holds 8" in lines[0]


def test_bare_radixscope_prints_what_it_can_do(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: radixscope ")
    assert all(f"    {c}" in err for c in ("run", "doctor", "ui", "export")), err
