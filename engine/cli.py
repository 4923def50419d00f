"""The ``radixscope`` command: ``run``, ``doctor``, ``ui``, ``export``.

Bad input (an unknown workload, a negative size, a missing or corrupt store...) prints one line
``radixscope <command>: error: ...`` on stderr and exits 2; never a traceback. ``run`` exits 1
when the run found a problem (content mismatch, invariant violation, an admitted request out of
memory, a stuck engine, a store telemetry could not complete).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from radixscope.cache.config import PRESETS, WRITE_POLICIES
from radixscope.cache.storage.setup import STORE_POLICIES
from radixscope.engine.run import PREFETCH_POLICIES, SIZE_FIELDS, RunSpec
from radixscope.engine.workloads import WORKLOADS
from radixscope.telemetry.kvevents import cli as kv_cli

DEFAULT_STORE = "runs/latest.db"
EXIT_BAD_INPUT = 2
EXIT_PROBLEM = 1


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block
        raise UsageError(f"{self.prog}: error: {message}")


def _int_at_least(lo: int, hi: int | None = None):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"{v} must be >= {lo}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"{v} must be <= {hi}")
        return v
    return parse


MAX_REQUESTS = 1_000_000
# objects frozen when this module is imported, taken as the interpreter's own, not a caller's
# choice: CPython 3.12 starts with 375 (3.11 and 3.13 with none). A caller that froze its own
# before importing the CLI has them thawed after a run.
_STARTUP_FROZEN = gc.get_freeze_count()
MAX_SEED = 2**32 - 1
LOOPBACK = "127.0.0.1"


def _device(text: str) -> str:
    """'auto', 'cpu', 'cuda' or 'cuda:N' (whether CUDA is there is the config's to say)."""
    t = text.strip().lower()
    if t in ("auto", "cpu", "cuda") or (t.startswith("cuda:") and t[5:].isdigit()):
        return t
    raise argparse.ArgumentTypeError(f"{text!r}: must be auto, cpu, cuda or cuda:N")


def _components(text: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in text.split(",") if c.strip())


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="radixscope", description="Observability-first hierarchical KV prefix "
                "cache: run a reference engine on it, inspect the store, open the UI.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="run the reference engine on a workload and write a store")
    r.add_argument("--workload", default="chat",
                   help=f"one of {', '.join(WORKLOADS)} (default chat)")
    r.add_argument("--trace", metavar="FILE", help="JSONL trace (with --workload trace)")
    r.add_argument("--preset", help=f"model preset: one of {', '.join(sorted(PRESETS))} "
                   "(default: from --components, else hybrid)")
    r.add_argument("--components", type=_components, help="full | full,swa | full,mamba | "
                   "full,swa,mamba")
    r.add_argument("--device", type=_device, default="auto",
                   help="where the device pools live: auto (cuda when present, else cpu), "
                   "cpu, cuda or cuda:N; host pools are pinned under cuda")
    r.add_argument("--write-policy", choices=WRITE_POLICIES, default="write_through",
                   help="when device pages are backed up to host (default write_through)")
    r.add_argument("--requests", type=_int_at_least(1, MAX_REQUESTS),
                   help="number of requests (default 200; trace: every line)")
    r.add_argument("--seed", type=_int_at_least(0, MAX_SEED), default=0,
                   help="workload seed (default 0)")
    r.add_argument("--store", default=DEFAULT_STORE, help=f"store path (default {DEFAULT_STORE})")
    r.add_argument("--no-store", action="store_true", help="run without telemetry")
    r.add_argument("--check-invariants", action="store_true",
                   help="check() after every step; stop at the first violation")
    for f in SIZE_FIELDS:
        unit = "states" if f.startswith("mamba") else "tokens"
        r.add_argument("--" + f.replace("_", "-"), dest=f, type=_int_at_least(1 if f in (
            "page_size", "device_tokens", "mamba_slots") else 0), metavar="N",
            help="tokens per page (default: the preset's)" if f == "page_size"
            else f"pool size in {unit} (default: the preset's)")
    r.add_argument("--chunk-tokens", type=_int_at_least(1), default=256, metavar="N",
                   help="prefill chunk per request and step (default 256)")
    r.add_argument("--prefill-budget", type=_int_at_least(1), default=512, metavar="N",
                   help="prefill tokens per step (default 512)")
    r.add_argument("--max-running", type=_int_at_least(1), default=16, metavar="N",
                   help="requests running at once (default 16)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--storage", metavar="SPEC", help="L3 storage tier: file:DIR | "
                   "redis://HOST:PORT | mooncake://HOST:PORT?metadata=URL")
    r.add_argument("--prefetch-policy", choices=PREFETCH_POLICIES, default="timeout",
                   help="when a prefetching request may stop and run (with --storage)")
    r.add_argument("--storage-write", choices=STORE_POLICIES, default="write_through",
                   help="when host pages are written to L3 (with --storage)")
    r.add_argument("--prefetch-threshold", type=_int_at_least(0), default=256, metavar="N",
                   help="tokens past the host match below which no prefetch runs "
                   "(default 256)")
    r.add_argument("--load-back-threshold", type=_int_at_least(0), default=0, metavar="N",
                   help="FULL-only host hits shorter than N tokens are not loaded back "
                   "(default 0)")
    r.add_argument("--inject", metavar="NAME", help="demo: re-introduce a bug-zoo crash class "
                   "on the cache (docs/zoo.md); implies a check after every cache operation")
    kv_cli.add_run_options(r)
    kv_cli.add_watch_parser(sub)
    d = sub.add_parser("doctor", help="budget, violations and admissions of a store in words")
    d.add_argument("store", help="a telemetry store (runs/latest.db after a run)")
    u = sub.add_parser("ui", help="open the Streamlit UI on a store")
    u.add_argument("store", help="a telemetry store (runs/latest.db after a run)")
    u.add_argument("--port", type=_int_at_least(1, 65535),
                   help="port to serve on (default: Streamlit's, 8501)")
    u.add_argument("--headless", action="store_true",
                   help="open no browser (a remote machine: forward the port over SSH)")
    u.add_argument("--address", default=LOOPBACK,
                   help=f"interface to listen on (default {LOOPBACK}: this machine only; "
                   "anything else makes the UI reachable from other hosts)")
    u.add_argument("--root", metavar="DIR", help="folder whose stores the sidebar may open "
                   "(default: the store's folder); any other path is refused")
    e = sub.add_parser("export", help="export a store")
    e.add_argument("store", help="a telemetry store")
    e.add_argument("--perfetto", metavar="FILE", required=True,
                   help="Chrome / Perfetto trace-event JSON (open in ui.perfetto.dev)")
    return p


# ---- commands ----------------------------------------------------------------------------
def _check_store_target(path: str) -> None:
    """Refuse a store path that cannot be written, or a file that is not a radixscope store."""
    def bad(why: str) -> UsageError:
        return UsageError(f"radixscope run: error: --store {path!r} {why}")
    if not path.strip() or "\0" in path:
        raise bad("is not a valid file path")
    p = Path(path)
    if p.is_dir():
        raise bad("is a directory, not a store file")
    if p.exists():
        from radixscope.telemetry import open_store
        try:
            open_store(p).close()
        except (ValueError, FileNotFoundError):
            raise bad("exists and is not a radixscope store; refusing to overwrite it") from None
    ancestor = p.absolute().parent
    while not ancestor.exists():  # the run creates missing folders: test the nearest one there
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise bad(f"cannot be created: {str(ancestor)!r} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as e:
        raise bad(f"cannot be written: no file can be made in {str(ancestor)!r} "
                  f"({e.strerror or type(e).__name__})") from None
    if p.exists() and not os.access(p, os.W_OK):
        raise bad("is not writable")


def cmd_run(ns: argparse.Namespace) -> int:
    store = None if ns.no_store else ns.store
    try:
        kv_cli.check_run_options(ns)
    except ValueError as e:
        raise UsageError(f"radixscope run: error: {e}") from None
    with kv_cli.run_options(ns):
        return _run(ns, store)


def _run(ns: argparse.Namespace, store: str | None) -> int:
    from radixscope.engine.progress import ProgressBar
    from radixscope.engine.run import execute
    from radixscope.engine.summary import format_summary, summarize

    if store is not None:
        _check_store_target(store)
    spec = RunSpec(workload=ns.workload, requests=ns.requests, seed=ns.seed, preset=ns.preset,
                   components=ns.components, write_policy=ns.write_policy,
                   sizes={f: getattr(ns, f) for f in SIZE_FIELDS if getattr(ns, f) is not None},
                   store=store, check_invariants=ns.check_invariants,
                   chunk_tokens=ns.chunk_tokens, prefill_budget=ns.prefill_budget,
                   max_running=ns.max_running, trace=ns.trace, storage=ns.storage,
                   prefetch_policy=ns.prefetch_policy, storage_write=ns.storage_write,
                   prefetch_threshold=ns.prefetch_threshold,
                   load_back_threshold=ns.load_back_threshold,
                   device=None if ns.device == "auto" else ns.device)
    bar = ProgressBar(0, enabled=False if ns.no_progress else None)
    # what exists before the run (torch's ~165 k objects, the imports) stays: out of the
    # collector's way for the run, a full collection takes ~15-22 ms instead of ~65-107
    # (bench/RESULTS.md, "#17, fifteenth round"), as a serving engine freezes after warm-up;
    # handed back after, so a caller of ``main`` in its own process collects as before (a
    # caller that froze its own objects has chosen: nothing is frozen or unfrozen for it)
    frozen = gc.get_freeze_count() > _STARTUP_FROZEN
    if not frozen:
        gc.freeze()
    try:
        result = execute(spec, on_step=lambda e: _draw(bar, e), inject=ns.inject)
    except (ValueError, OSError) as e:  # bad settings; a store path that cannot be written
        raise UsageError(f"radixscope run: error: {e}") from None
    finally:
        if not frozen:
            gc.unfreeze()
        bar.close()
    summary = summarize(result)
    print(format_summary(summary))
    if result.error is not None:
        print(f"radixscope run: {result.error_kind} problem: {result.error}", file=sys.stderr)
        return EXIT_PROBLEM
    if summary.telemetry_problem:
        print(f"radixscope run: the store {result.store} is incomplete: "
              f"{summary.telemetry_problem}", file=sys.stderr)
        return EXIT_PROBLEM
    if summary.budget_violations:
        print(f"radixscope run: {summary.budget_violations} admitted requests ran out of memory "
              "in their load-back or first chunk (see radixscope doctor)", file=sys.stderr)
        return EXIT_PROBLEM
    rejected = result.engine.rejected
    if rejected and not result.engine.done:  # nothing ran: the pools are too small for it
        first = rejected[0]
        print(f"radixscope run: all {len(rejected)} requests were rejected; the first, "
              f"{first.rid}: {first.last_reason or first.first_reason}", file=sys.stderr)
        return EXIT_PROBLEM
    if result.injection is not None:  # a clean run with a fault in: the demo showed nothing
        fired = len(result.injection.fired)
        why = ("never fired: these settings do not reach its buggy path" if not fired else
               f"fired {fired} times and no check found a problem in this run")
        print(f"radixscope run: --inject {ns.inject} {why} (docs/zoo.md gives settings that "
              "do)", file=sys.stderr)
        return EXIT_PROBLEM
    return 0


def _draw(bar, engine) -> None:
    bar.total = max(1, engine.total)
    bar(engine)


def _naming(path: str, error: BaseException) -> str:
    """An error about the store at ``path`` as one line that names it once."""
    text = str(error)
    return text if repr(path) in text or repr(str(Path(path).absolute())) in text \
        else f"{path!r}: {text}"


def _open_checked(path: str, command: str):
    from radixscope.telemetry import open_store
    try:
        return open_store(path)
    except FileNotFoundError:
        raise UsageError(f"radixscope {command}: error: no store at {path!r}") from None
    except ValueError as e:
        raise UsageError(f"radixscope {command}: error: {e}") from None


def cmd_doctor(ns: argparse.Namespace) -> int:
    from radixscope.engine.doctor import diagnose

    _open_checked(ns.store, "doctor").close()
    try:
        report = diagnose(ns.store)
    except (ValueError, KeyError, TypeError, OSError) as e:  # a damaged or hostile file
        raise UsageError(f"radixscope doctor: error: {_naming(ns.store, e)}") from None
    print(report.text)
    return 0 if report.healthy else EXIT_PROBLEM


def ui_app_path() -> Path | None:
    """The UI's Streamlit entrypoint (``ui/app.py``), or None when the UI is not installed."""
    try:  # the installed package's file (imports the ui package, not the app itself)
        spec = importlib.util.find_spec("radixscope.ui.app")
    except ModuleNotFoundError:
        return None
    if spec is None or spec.origin is None:
        return None
    app = Path(spec.origin)
    return app if app.is_file() else None


def _ui_root(ns: argparse.Namespace) -> str:
    """The folder the UI may open stores under: ``--root``, else the store's folder."""
    store = os.path.realpath(ns.store)
    if ns.root is None:
        return os.path.dirname(store)
    root = os.path.realpath(ns.root)
    if not os.path.isdir(root):
        raise UsageError(f"radixscope ui: error: --root {ns.root!r} is not a directory")
    if os.path.commonpath([root, store]) != root:
        raise UsageError(f"radixscope ui: error: the store {ns.store!r} is not under --root "
                         f"{ns.root!r}")
    return root


def _check_address(address: str) -> None:
    """Refuse a malformed ``--address``; warn (stderr) when it is not loopback-only."""
    import ipaddress

    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        if address != "localhost":
            raise UsageError(f"radixscope ui: error: --address {address!r} is not an IP "
                             "address (e.g. 127.0.0.1, ::1, 0.0.0.0)") from None
        return
    if not ip.is_loopback:
        print(f"radixscope ui: warning: listening on {address}: the UI (and every store under "
              "its root) is reachable from other hosts; it has no authentication",
              file=sys.stderr)


def cmd_ui(ns: argparse.Namespace) -> int:
    _open_checked(ns.store, "ui").close()
    root = _ui_root(ns)
    _check_address(ns.address)
    app = ui_app_path()
    if app is None:
        print("radixscope ui: the UI is not available in this installation (no ui/app.py)",
              file=sys.stderr)
        return EXIT_PROBLEM
    cmd = [sys.executable, "-m", "streamlit", "run", str(app),
           "--browser.gatherUsageStats", "false", "--server.address", ns.address]
    if ns.port is not None:
        cmd += ["--server.port", str(ns.port)]
    if ns.headless:
        cmd += ["--server.headless", "true"]
    cmd += ["--", "--store", os.path.abspath(ns.store), "--root", root]
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0


def cmd_export(ns: argparse.Namespace) -> int:
    from radixscope.telemetry import export_perfetto

    _open_checked(ns.store, "export").close()
    out = Path(ns.perfetto)
    _check_trace_target(ns.perfetto, ns.store)
    try:
        counts = export_perfetto(ns.store, out)
    except (ValueError, KeyError, TypeError, OSError) as e:  # a damaged or hostile file
        raise UsageError(f"radixscope export: error: {_naming(ns.store, e)}") from None
    parts = ", ".join(f"{v} {k}" for k, v in counts.items())
    print(f"wrote {out} ({parts}); open it in https://ui.perfetto.dev")
    if not any(counts.values()):
        print(f"radixscope export: note: {ns.store!r} holds no cache operations, spans or "
              "samples, so the trace is empty (a `radixscope watch` store holds an engine's "
              "blocks, not operations: open it with radixscope ui)", file=sys.stderr)
    return 0


_TRACE_HEAD = b'{"traceEvents"'  # how every trace ``export_perfetto`` writes begins


def _check_trace_target(path: str, store: str) -> None:
    """Refuse a ``--perfetto`` target that is not a file path, is the store itself, or is an
    existing file other than an earlier trace (one is replaced; anything else is kept)."""
    def bad(why: str) -> UsageError:
        return UsageError(f"radixscope export: error: --perfetto {path!r} {why}")
    if not path.strip() or "\0" in path:
        raise bad("is not a valid file path")
    out = Path(path)
    if out.is_dir():
        raise bad("is a directory")
    if not out.parent.exists():
        raise bad(f"cannot be written: directory {str(out.parent)!r} does not exist")
    if out.exists():
        if os.path.samefile(out, store):
            raise bad("is the store being exported; choose another file")
        if not out.is_file():  # /dev/stdout, a pipe: written as given, never read
            return
        try:
            with open(out, "rb") as f:
                head = f.read(len(_TRACE_HEAD))
        except OSError as e:
            raise bad(f"cannot be read ({e.strerror})") from None
        if out.stat().st_size and head != _TRACE_HEAD:
            raise bad("exists and is not a Perfetto trace; refusing to overwrite it")


COMMANDS = {"run": cmd_run, "doctor": cmd_doctor, "ui": cmd_ui, "export": cmd_export,
            "watch": kv_cli.cmd_watch}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``radixscope`` console script. Returns the exit status."""
    if not (sys.argv[1:] if argv is None else argv):  # bare ``radixscope``: what it can do
        build_parser().print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        ns, extra = build_parser().parse_known_args(argv)
        if extra:
            raise UsageError(f"radixscope {ns.command}: error: unrecognized arguments: "
                             f"{' '.join(extra)}")
        return COMMANDS[ns.command](ns)
    except UsageError as e:
        print(str(e), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("radixscope: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
