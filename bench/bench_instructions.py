"""Telemetry's cost in instructions, step by step (issue 17): deterministic where time is not.

On this project's machines one change to the hot path moves ops/s by less than run-to-run
noise (+-2-4 points). Instruction counts do not move with the machine's load, so this bench
runs a short workload under valgrind's callgrind once per variant and prints the instructions
a request costs in each and what each adds over recording off, all from the same invocation.

The workload is ``bench_scale.py``'s (long multi-turn chat over shared system prompts, ~1-3 k
tokens a request, page size 1, FULL only, ~1 k resident nodes), driven as SGLang's scheduler
drives a cache. The fill runs on the Python ledger, which callgrind does not count
(``--toggle-collect=ledger_run`` counts only inside the native ledger's ``run``, the entry of
every public op); then ``--requests`` requests run on the native ledger, with recording on only
for the ops a variant names (the rest run plainly). Variants:

- ``off``: recording off (the baseline);
- ``match`` / ``insert`` / ``evict`` / ``lock`` / ``alloc`` / ``unlock``: one op recorded (its
  attributes, its mutations, its encode);
- ``on``: match, insert and evict recorded: the ops issue 17's ops/s counts (the ledger's
  records direct: ``cache/_direct.h``);
- ``nodirect``: as ``on``, with the ledger's ``direct = False`` (tuples made, then encoded);
- ``all``: every op of a request recorded (lock, alloc and unlock too);
- ``all-pyattrs``: as ``all``, every op's attributes built by its Python builder
  (``op_attrs.PY_ATTRS``): what the six ops' native specs save, in one invocation;
- ``all-pyrest``: as ``all``, lock's, alloc's and unlock's attributes built by their Python
  builders, as before the thirty-second round gave them specs: what those three save;
- ``norec``: as ``on``, the recorder a C callable that keeps nothing (``slice``, a few hundred
  instructions a call). ``slice`` has no direct table, so the ledger makes the record's tuple
  and decodes the op's mutations into tuples for it: this reads *above* ``on`` (18.3 k against
  13.0 k a request, 2026-11-28) and measures the path without direct records, not the encode;
- ``norec-noattrs``: the attribute builders ``slice`` too;
- ``pyattrs`` / ``norec-pyattrs``: as ``on`` / ``norec``, with the Python attribute builders
  (``op_attrs.PY_ATTRS``), not the hot ops' specs run natively (``native.Fields``);
- ``nomuts``: as ``on``, the cache's state-change sites skipped (op records only, encoded);
- ``records``: no recorder, no attributes, no mutations: the ledger's own record.

Needs valgrind (Debian's ``valgrind``); about a minute a variant on a 2-core machine.
Counts are the process's, Python interpreter included, with ``PYTHONHASHSEED=0``; they differ
from build to build of Python, so compare counts from one machine. They also move by 1-4 k a
request from one invocation to the next (interned names and types at other addresses, so the
interpreter's method cache collides elsewhere): compare variants measured in one invocation.

    python bench/bench_instructions.py
    python bench/bench_instructions.py --requests 300 --variants on,match,norec
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
OPS = ("match", "lock", "evict", "alloc", "insert", "unlock")
VARIANTS = {  # name -> (ops recorded, flags, what it is)
    "off": ((), (), "recording off"),
    "match": (("match",), (), "match recorded"),
    "insert": (("insert",), (), "insert recorded"),
    "evict": (("evict",), (), "evict recorded"),
    "lock": (("lock",), (), "lock recorded"),
    "alloc": (("alloc",), (), "alloc recorded"),
    "unlock": (("unlock",), (), "unlock recorded"),
    "on": (("match", "insert", "evict"), (), "match + insert + evict recorded"),
    "nodirect": (("match", "insert", "evict"), ("nodirect",), "on, direct records off"),
    "all": (OPS, (), "every op recorded"),
    "all-pyattrs": (OPS, ("pyattrs",), "all, Python attribute builders"),
    "all-pyrest": (OPS, ("pyrest",), "all, lock/alloc/unlock's Python builders"),
    "norec": (("match", "insert", "evict"), ("norec",), "on, no recorder"),
    "norec-noattrs": (("match", "insert", "evict"), ("norec", "noattrs"),
                      "on, no recorder, no attributes"),
    "pyattrs": (("match", "insert", "evict"), ("pyattrs",), "on, Python attribute builders"),
    "norec-pyattrs": (("match", "insert", "evict"), ("norec", "pyattrs"),
                      "norec, Python attribute builders"),
    "nomuts": (("match", "insert", "evict"), ("nomuts",), "on, no mutations"),
    "records": (("match", "insert", "evict"), ("norec", "noattrs", "nomuts"),
                "on, the ledger's records only"),
}


def child(variant: str, requests: int) -> None:
    """The measured process: fill on the Python ledger, then the variant's requests."""
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE.parents[1]))
    import torch
    from scale_workload import Chat, fill, make_cache, one_request

    from radixscope.cache import ledger, recording
    from radixscope.cache.op_attrs import OP_ATTRS, PY_ATTRS
    from radixscope.telemetry.record.drops import Health
    from radixscope.telemetry.record.recorder import TelemetryRecorder

    torch.set_num_threads(1)
    recorded, flags, _ = VARIANTS[variant]
    rec = TelemetryRecorder(Health(), queue_capacity=1 << 62, encode_batch=1 << 62)
    c = make_cache(1000, ("full",), rec)
    ctx = recording._CONTEXT

    def use(led, on: bool) -> None:
        led.seq, led.op_id, led.cur_op = c.seq, c._ledger.op_id, c._ledger.cur_op
        c.use_ledger(led)
        c._on = led.on = on

    def drop() -> None:
        rec.seal()
        rec.take(1 << 62)

    python = ledger.PyLedger(c, rec.record, ctx, OP_ATTRS, True)  # not counted
    use(python, True)
    chat = Chat(active=max(16, 1000 // 12))

    def each(i: int, _calls: int) -> None:
        if (i + 1) % 1000 == 0:
            drop()

    i = fill(c, chat, 1000, each)
    for _ in range(200):
        one_request(c, chat.next(), None, f"w{i}")
        i += 1
    drop()
    attrs = (dict.fromkeys(OP_ATTRS, slice) if "noattrs" in flags
             else PY_ATTRS if "pyattrs" in flags else OP_ATTRS)
    if "pyrest" in flags:
        attrs = {**OP_ATTRS, **{op: PY_ATTRS[op] for op in ("lock", "alloc", "unlock")}}
    led = ledger.Ledger(c, slice if "norec" in flags else rec.record, ctx, attrs, True)
    if "nodirect" in flags:
        led.direct = False
    use(led, False)
    sites = "nomuts" not in flags

    def on(op: str) -> None:
        led.on = op in recorded
        c._on = led.on and sites

    for j in range(requests):  # scale_workload.one_request, switching recording per op
        key, rid = chat.next(), f"r{j}"
        on("match")
        m = c.match_prefix(key, req_id=rid)
        on("lock")
        r = c.lock(m.last_device_node, owner=rid)
        n = len(key) - m.device_prefix_len
        if n > c.available():
            on("evict")
            c.evict(n - c.available())
        on("alloc")
        idx = c.alloc(n)
        full = torch.cat([m.device_indices, idx])
        on("insert")
        c.insert(key, full, prev_prefix_len=m.device_prefix_len, branch_len=m.branch_len,
                 req_id=rid)
        on("unlock")
        c.unlock(r)
    use(python, False)
    c.check()  # on the Python ledger: not counted


def measure(variant: str, requests: int, tmp: str) -> float:
    """Instructions a request in ``variant`` (callgrind's count over ``requests``)."""
    out = Path(tmp) / "callgrind.out"
    cmd = ["valgrind", "--tool=callgrind", "--toggle-collect=ledger_run",
           f"--callgrind-out-file={out}", sys.executable, str(HERE), "--child", variant,
           "--requests", str(requests)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                       env={**os.environ, "PYTHONHASHSEED": "0"}, check=False)
    found = re.search(r"Collected : (\d+)", p.stderr)
    if p.returncode != 0 or found is None:
        sys.exit(f"{variant}: valgrind exited {p.returncode}\n{p.stderr[-2000:]}")
    return int(found.group(1)) / requests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="measured requests per variant")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated, from: " + ", ".join(VARIANTS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.requests)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    chosen = [v.strip() for v in args.variants.split(",")]
    bad = [v for v in chosen if v not in VARIANTS]
    if bad:
        sys.exit(f"unknown variant {bad[0]!r}: choose from {', '.join(VARIANTS)}")
    if "off" not in chosen:
        chosen.insert(0, "off")
    with tempfile.TemporaryDirectory(prefix="bench_instructions_") as tmp:
        counts = {v: measure(v, args.requests, tmp) for v in chosen}
    base = counts["off"]
    print(f"instructions a request (callgrind, {args.requests} requests after a 1 k-node fill, "
          "FULL only, inside the ledger's run)")
    print(f"  {'':>52} {'k instr':>8} {'adds, k':>8} {'of off':>7}")
    for v, n in counts.items():
        label = f"{v}: {VARIANTS[v][2]}"
        print(f"  {label:>52} {n / 1e3:8.1f} {(n - base) / 1e3:8.1f} {(n - base) / base:7.1%}")


if __name__ == "__main__":
    main()
