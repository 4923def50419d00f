"""Replay of a JSONL trace: one request per line.

Each line is a JSON object with:

- ``arrival`` (engine step, int >= 0) or ``timestamp`` (milliseconds; ``ms_per_step`` converts);
- the prompt: ``tokens`` (list of token ids) or ``input_length`` (int >= 1), optionally with
  ``hash_ids`` (Mooncake-style block ids: equal ids give equal blocks of ``block_size`` tokens,
  so prompts that share leading ids share a prefix; ``block_size`` may be set per line);
- the output: ``output_length`` (int >= 0, default 16) or ``output_tokens`` (list);
- optional ``id`` and ``extra_key`` (str).

Bad lines raise ``ValueError`` naming the file, line number and field.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from radixscope.engine.request import RequestSpec
from radixscope.engine.workloads.base import VOCAB, Tokens

DEFAULT_BLOCK = 64


def _block(hash_id: int, size: int) -> tuple[int, ...]:
    rng = random.Random(hash_id * 1_000_003 + size)
    return tuple(rng.randrange(VOCAB) for _ in range(size))


def _ids(obj: dict, field: str, where: str) -> tuple[int, ...]:
    v = obj[field]
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                          and t >= 0 for t in v):
        raise ValueError(f"{where}: {field!r} must be a list of token ids >= 0")
    return tuple(v)


def _int(obj: dict, field: str, where: str, lo: int, default: int | None = None) -> int:
    if field not in obj:
        if default is None:
            raise ValueError(f"{where}: missing {field!r}")
        return default
    v = obj[field]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < lo or v != int(v):
        raise ValueError(f"{where}: {field}={v!r} must be an integer >= {lo}")
    return int(v)


def parse_line(obj: object, where: str, index: int, ms_per_step: float,
               fill: Tokens) -> RequestSpec:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "arrival" in obj:
        arrival = _int(obj, "arrival", where, 0)
    elif "timestamp" in obj:
        arrival = int(_int(obj, "timestamp", where, 0) / ms_per_step)
    else:
        arrival = 0
    if "tokens" in obj:
        prompt = _ids(obj, "tokens", where)
        if not prompt:
            raise ValueError(f"{where}: 'tokens' is empty")
    else:
        n = _int(obj, "input_length", where, 1)
        size = _int(obj, "block_size", where, 1, DEFAULT_BLOCK)
        prompt = ()
        if "hash_ids" in obj:
            for h in _ids(obj, "hash_ids", where):
                prompt += _block(h, size)
        prompt = prompt[:n] + fill.ids(n - len(prompt))
    if "output_tokens" in obj:
        output = _ids(obj, "output_tokens", where)
    else:
        output = fill.ids(_int(obj, "output_length", where, 0, 16))
    rid = obj.get("id", f"trace-{index}")
    extra = obj.get("extra_key")
    if extra is not None and not isinstance(extra, str):
        raise ValueError(f"{where}: extra_key={extra!r} must be a string")
    return RequestSpec(str(rid), prompt + output, len(prompt), arrival=arrival, extra_key=extra,
                       kind="trace")


def load(path: str | Path, n: int | None = None, seed: int = 0,
         ms_per_step: float = 10.0) -> list[RequestSpec]:
    """The first ``n`` requests (all if None) of the JSONL trace at ``path``."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"trace file {str(p)!r} does not exist")
    if ms_per_step <= 0:
        raise ValueError(f"ms_per_step={ms_per_step!r} must be > 0")
    fill = Tokens(seed + 4)
    out: list[RequestSpec] = []
    seen: set[str] = set()
    with p.open() as f:
        for lineno, line in enumerate(f, 1):
            if n is not None and len(out) >= n:
                break
            if not line.strip():
                continue
            where = f"{p}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
            spec = parse_line(obj, where, len(out), ms_per_step, fill)
            if spec.rid in seen:
                raise ValueError(f"{where}: duplicate request id {spec.rid!r}")
            seen.add(spec.rid)
            out.append(spec)
    if not out:
        raise ValueError(f"trace file {str(p)!r} holds no requests")
    return out


def write_sample(path: str | Path, n: int, seed: int = 0, block_size: int = DEFAULT_BLOCK,
                 documents: int = 12, mean_gap: float = 2.0) -> Path:
    """Write a Mooncake-style sample trace of ``n`` lines: prompts built from shared block ids
    (a few popular documents, each a run of blocks), random lengths and arrivals. Every third
    document is served under the namespace ``extra_key="lora-1"``."""
    tok = Tokens(seed + 5)
    docs = [list(range(d * 100, d * 100 + tok.length(2, 10))) for d in range(documents)]
    p = Path(path)
    t = 0.0
    with p.open("w") as f:
        for i in range(n):
            doc = tok.zipf_index(documents)
            ids = docs[doc]
            keep = tok.rng.randint(1, len(ids))
            extra = tok.length(0, block_size * 2)
            line = {"id": f"trace-{i}", "arrival": int(t), "hash_ids": ids[:keep] + [10_000 + i],
                    "input_length": keep * block_size + extra, "block_size": block_size,
                    "output_length": tok.length(4, 48)}
            if doc % 3 == 2:
                line["extra_key"] = "lora-1"
            f.write(json.dumps(line) + "\n")
            t += tok.rng.expovariate(1.0 / mean_gap)
    return p
