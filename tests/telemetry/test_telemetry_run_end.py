"""How a run ended is in its store: a killed run (host and writer SIGKILLed) and an engine that
raised are never reported "healthy"; a clean run says it finished (issue 12, items 12 and 14)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from radixscope import telemetry
from radixscope.engine.cli import main
from radixscope.engine.run import RunSpec, execute
from radixscope.telemetry.analysis.load import load_bundle

ROOT = Path(__file__).resolve().parents[2]
LONG = ["--workload", "chat", "--requests", "100000", "--no-progress", "--device-tokens", "2048",
        "--host-tokens", "4096"]


def _stat(pid: int | str) -> list[str] | None:
    """``/proc/<pid>/stat``'s fields after the command name (state, ppid, ...); None: gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (Linux /proc)."""
    return [int(d.name) for d in Path("/proc").iterdir()
            if d.name.isdigit() and (st := _stat(d.name)) is not None and int(st[1]) == pid]


def _alive(pid: int) -> bool:
    """``pid`` runs (a zombie, waiting for init to reap it, has exited)."""
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def _ops_in(store: Path) -> int:
    try:
        with telemetry.open_store(store) as r:
            return len(r.ops())
    except (FileNotFoundError, ValueError):
        return 0


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_killed_run_and_writer_doctor_says_it_did_not_finish_cleanly(tmp_path, capsys):
    store = tmp_path / "runs" / "killed.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "radixscope.engine.cli", "run", *LONG,
                             "--store", str(store)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while _ops_in(store) < 200:  # mid-run: the writer has committed some batches
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the run never got going"
            time.sleep(0.2)
        writers = _children(proc.pid)
        assert writers, "the run has no writer process"
        for pid in writers:  # the writer first, so it cannot close the store on EOF
            os.kill(pid, signal.SIGKILL)
        proc.kill()
    finally:
        proc.kill()
        proc.wait(timeout=60)
    for pid in writers:
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # SIGKILLed: gone, or a zombie until init reaps it
    with telemetry.open_store(store) as r:
        status = r.run_status()
        last = r.last_seq()
    assert status["state"] == "unclosed" and not status["clean"]
    assert status["last_seq"] == last and status["last_ns"] > 0
    assert main(["doctor", str(store)]) == 1
    out = capsys.readouterr().out
    assert "run: PROBLEM: the run did NOT finish cleanly: the store was never closed" in out
    assert f"last seq {last}, last record at " in out
    assert "verdict: PROBLEMS FOUND" in out and "verdict: healthy" not in out


def test_host_killed_writer_records_an_unclean_end(tmp_path):
    """Only the host dies: the writer sees its pipe close, closes the store and says so."""
    store = tmp_path / "host.db"
    code = ("import os, signal; from radixscope import telemetry\n"
            "from radixscope.cache import HiRadixCache\n"
            "from tests.kits.cachekit import Driver, make_config\n"
            f"tel = telemetry.setup(store={str(store)!r}, capture_host_spans=False)\n"
            "c = HiRadixCache(make_config(), recorder=tel.recorder)\n"
            "Driver(c).insert([1, 2, 3], req_id='a')\n"
            "tel.flush()\n"
            "print(tel.pipeline.transport.process.pid, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    writer = int(p.stdout.split()[0])
    try:
        deadline = time.monotonic() + 60
        while _alive(writer) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(writer), "the writer did not exit when its host died"
        with telemetry.open_store(store) as r:
            status = r.run_status()
            assert status["state"] == "ended" and not status["clean"], status
            assert r.info()["closed"]["clean"] is False
            assert "ended without closing telemetry" in status["message"]
    finally:  # a writer that missed its host's death must not outlive the test
        if _alive(writer):
            os.kill(writer, signal.SIGKILL)


def test_clean_run_says_it_finished(tmp_path):
    res = execute(RunSpec(workload="fewshot", requests=6, preset="full",
                          store=str(tmp_path / "ok.db"), telemetry_mode="inline"))
    assert res.ok, res.error
    with telemetry.open_store(tmp_path / "ok.db") as r:
        status = r.run_status()
        assert status["state"] == "closed" and status["clean"]
        assert r.info()["closed"]["last_seq"] == r.last_seq() == status["last_seq"]


class Boom(RuntimeError):
    pass


def test_engine_exception_leaves_a_bundle_and_doctor_reports_it(tmp_path, capsys, monkeypatch):
    """An exception inside the engine (here: the stand-in model raises while writing KV, not a
    cache call) ends the run with a crash bundle and a violation in the store."""
    from radixscope.engine.model import StandInModel

    calls = {"n": 0}
    real = StandInModel.write_kv

    def failing(self, cache, comp, idx, hashes):
        calls["n"] += 1
        if calls["n"] == 5:
            raise Boom("the stand-in model blew up")
        return real(self, cache, comp, idx, hashes)

    monkeypatch.setattr(StandInModel, "write_kv", failing)
    store = tmp_path / "runs" / "crash.db"
    res = execute(RunSpec(workload="fewshot", requests=8, preset="full", store=str(store),
                          telemetry_mode="inline"))
    assert res.error_kind == "crash" and "Boom: the stand-in model blew up" in res.error
    assert "Boom" in res.violation["traceback"]
    assert len(res.bundles) == 1
    with load_bundle(res.bundles[0]) as b:
        f = b.failure()
        assert f["exception"] == "Boom" and f["op"] == "engine"
        assert "blew up" in f["message"]
    with telemetry.open_store(store) as r:
        v = r.violations()  # the bundler's announcement, then the run's verdict
        assert list(v["kind"]) == ["exception", "crash"]
        assert all("Boom" in m for m in v["message"])
        assert v["details"].iloc[1]["bundles"] == [str(res.bundles[0])]
        assert r.run_status()["clean"]  # telemetry itself was closed
    assert main(["doctor", str(store)]) == 1
    out = capsys.readouterr().out
    assert "[crash]" in out and "verdict: PROBLEMS FOUND" in out
