"""Bad command-line input (issue 12, item 9 and the CLI part of the bad-input battery): every
argument error of ``radixscope run`` / ``ui`` / ``doctor`` / ``export`` is one line on stderr,
``radixscope <command>: error: ...`` naming the bad value, exit 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from radixscope.engine import cli
from radixscope.engine.cli import main
from tests.kits.storagekit import free_port
from tests.kits.ui_store import make_store

ROOT = Path(__file__).resolve().parents[2]
HUGE = str(10**13)
_DOWN = free_port()  # a loopback port nothing listens on


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bad-input") / "run.db"
    make_store(path)
    return path


@pytest.fixture(scope="module")
def junk(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("junk") / "notes.txt"
    path.write_text("not a store\n")
    return path


RUN_CASES = [  # (id, args, text the one line must hold)
    ("unknown workload", ["--workload", "nope"], "'nope'"),
    ("unknown preset", ["--preset", "gigantic"], "'gigantic'"),
    ("unknown component", ["--components", "full,attn"], "full,attn"),
    ("components out of order", ["--components", "swa,full"], "swa,full"),
    ("components vs preset", ["--components", "full", "--preset", "swa"], "--preset swa"),
    ("write policy", ["--write-policy", "write_around"], "write_around"),
    ("requests zero", ["--requests", "0"], "0 must be >= 1"),
    ("requests negative", ["--requests", "-3"], "-3 must be >= 1"),
    ("requests not int", ["--requests", "ten"], "'ten' is not an integer"),
    ("requests huge", ["--requests", HUGE], f"{HUGE} must be <= 1000000"),
    ("seed negative", ["--seed", "-1"], "-1 must be >= 0"),
    ("seed huge", ["--seed", str(2**70)], f"{2**70} must be <= 4294967295"),
    ("seed float", ["--seed", "1.5"], "'1.5' is not an integer"),
    ("page size zero", ["--page-size", "0"], "0 must be >= 1"),
    ("pool not whole pages", ["--page-size", "3", "--device-tokens", "1000"],
     "device_tokens=1000: must be a multiple of page_size=3"),
    ("device tokens zero", ["--device-tokens", "0"], "0 must be >= 1"),
    ("device tokens huge", ["--device-tokens", HUGE], "bytes"),
    ("host tokens negative", ["--host-tokens", "-1"], "-1 must be >= 0"),
    ("host tokens huge", ["--host-tokens", HUGE], "of cpu memory"),
    ("swa size without swa", ["--preset", "full", "--swa-device-tokens", "64"],
     "swa_device_tokens=64"),
    ("mamba slots zero", ["--mamba-slots", "0"], "0 must be >= 1"),
    ("mamba slots huge", ["--mamba-slots", HUGE], "mamba/device"),
    ("chunk tokens zero", ["--chunk-tokens", "0"], "0 must be >= 1"),
    ("prefill budget text", ["--prefill-budget", "lots"], "'lots'"),
    ("max running negative", ["--max-running", "-2"], "-2 must be >= 1"),
    ("trace without file", ["--workload", "trace"], "--trace"),
    ("trace missing", ["--workload", "trace", "--trace", "/nonexistent/t.jsonl"],
     "/nonexistent/t.jsonl"),
    ("unknown option", ["--layers", "3"], "--layers"),
    ("store in /proc", ["--store", "/proc/x.db"], "'/proc/x.db' cannot be written"),
    ("store empty", ["--store", ""], "--store '' is not a valid file path"),
    ("store under a file", ["--store", "/etc/hostname/x.db"], "'/etc/hostname' is not a "
                                                             "directory"),
    ("store a directory", ["--store", "/tmp"], "'/tmp' is a directory"),
    ("store a device", ["--store", "/dev/null"], "not a radixscope store"),
    ("prefetch policy unknown", ["--storage", "file:/tmp/rs-l3-x", "--prefetch-policy", "soon"],
     "'soon'"),
    ("storage write unknown", ["--storage", "file:/tmp/rs-l3-x", "--storage-write", "never"],
     "'never'"),
    ("storage spec unknown", ["--storage", "s3://bucket"], "'s3://bucket'"),
    ("storage file without dir", ["--storage", "file:"], "file: needs a directory"),
    ("prefetch threshold negative", ["--prefetch-threshold", "-1"], "-1 must be >= 0"),
    # a Redis target is probed once when the run opens it: nothing listens on a free port
    ("storage redis down", ["--storage", f"redis://127.0.0.1:{_DOWN}"],
     f"redis redis://127.0.0.1:{_DOWN}: no Redis server answers"),
    ("storage redis down, maxmemory", ["--storage", f"redis://127.0.0.1:{_DOWN}?maxmemory=9999"],
     f"redis redis://127.0.0.1:{_DOWN}: cannot set maxmemory=9999"),
]


@pytest.mark.parametrize("args,needle", [c[1:] for c in RUN_CASES], ids=[c[0] for c in RUN_CASES])
def test_run_argument_error_is_one_line(args, needle, capsys):
    extra = [] if "--store" in args else ["--no-store"]
    assert main(["run", *args, *extra, "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("radixscope run: error: "), err
    assert needle in err, err


def test_run_store_under_a_foreign_file(junk, capsys):
    assert main(["run", "--store", str(junk), "--no-progress"]) == 2
    assert "not a radixscope store" in capsys.readouterr().err


UI_CASES = [
    ("port zero", ["--port", "0"], "0 must be >= 1"),
    ("port too big", ["--port", "70000"], "70000 must be <= 65535"),
    ("port text", ["--port", "http"], "'http' is not an integer"),
    ("address not an ip", ["--address", "every-interface"], "'every-interface' is not an IP"),
    ("address empty", ["--address", ""], "'' is not an IP"),
    ("root missing", ["--root", "/nonexistent/dir"], "--root '/nonexistent/dir' is not a "
                                                     "directory"),
    ("root elsewhere", ["--root", "/usr"], "is not under --root '/usr'"),
]


@pytest.mark.parametrize("args,needle", [c[1:] for c in UI_CASES], ids=[c[0] for c in UI_CASES])
def test_ui_argument_error_is_one_line(args, needle, store, capsys, monkeypatch):
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd: pytest.fail(f"started {cmd}"))
    assert main(["ui", str(store), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("radixscope ui: error: ") and needle in err, err


@pytest.mark.parametrize("command,args,needle", [
    ("ui", ["/nonexistent/s.db"], "no store at '/nonexistent/s.db'"),
    ("doctor", ["/nonexistent/s.db"], "no store at '/nonexistent/s.db'"),
    ("doctor", [], "the following arguments are required: store"),
    ("export", ["/nonexistent/s.db", "--perfetto", "t.json"], "'/nonexistent/s.db'"),
    ("export", ["STORE"], "--perfetto"),
    ("export", ["STORE", "--perfetto", "/"], "--perfetto '/' is a directory"),
    ("export", ["STORE", "--perfetto", "/nonexistent/t.json"], "'/nonexistent' does not exist"),
    ("frobnicate", [], "invalid choice: 'frobnicate'"),
])
def test_other_commands_argument_errors(command, args, needle, store, capsys):
    args = [str(store) if a == "STORE" else a for a in args]
    assert main([command, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and needle in err, err


# ---- item 11: the UI command binds loopback unless told otherwise ------------------------
def _ui_command(store: Path, monkeypatch, *args: str) -> tuple[int, list[str]]:
    seen: list[list[str]] = []
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd: seen.append(cmd) or 0)
    rc = main(["ui", str(store), *args])
    return rc, seen[0] if seen else []


def test_ui_starts_streamlit_on_loopback_with_the_store_folder_as_root(store, monkeypatch,
                                                                       capsys):
    rc, cmd = _ui_command(store, monkeypatch, "--port", "8765")
    assert rc == 0 and capsys.readouterr().err == ""
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--server.port") + 1] == "8765"
    tail = cmd[cmd.index("--") + 1:]
    assert tail == ["--store", str(store), "--root", os.path.realpath(store.parent)]


def test_ui_explicit_address_opts_in_with_a_warning(store, monkeypatch, capsys):
    rc, cmd = _ui_command(store, monkeypatch, "--address", "0.0.0.0", "--root",
                          str(store.parent.parent))
    assert rc == 0 and cmd[cmd.index("--server.address") + 1] == "0.0.0.0"
    err = capsys.readouterr().err
    assert err.startswith("radixscope ui: warning: listening on 0.0.0.0: ") \
        and "reachable from other hosts" in err
    assert cmd[-1] == os.path.realpath(store.parent.parent)


# ---- item 9 in a real process: no traceback ----------------------------------------------
def _radixscope(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "radixscope.engine.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_run_store_in_proc_printed_a_traceback(tmp_path):
    p = _radixscope(["run", "--store", "/proc/x.db", "--requests", "2", "--no-progress"],
                    tmp_path)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("radixscope run: error: --store '/proc/x.db' cannot be written")
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


def test_huge_device_tokens_printed_a_traceback(tmp_path):
    p = _radixscope(["run", "--device-tokens", HUGE, "--store", "runs/big.db", "--no-progress"],
                    tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1
    assert p.stderr.startswith("radixscope run: error: the cache's pools need ")
    where = "cuda" if torch.cuda.is_available() else "cpu"  # --device auto: the device pools'
    assert "bytes" in p.stderr and f"of {where} memory" in p.stderr and "available" in p.stderr
    assert not (tmp_path / "runs" / "big.db").exists()  # refused before the store was opened
