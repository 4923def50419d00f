"""Seeded, deterministic workloads: ``build(name, n, seed, ...) -> list[RequestSpec]``."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from radixscope.engine.request import RequestSpec
from radixscope.engine.workloads import agentic, chat, fewshot, synthetic, trace

GENERATORS: dict[str, Callable[..., list[RequestSpec]]] = {
    "chat": chat.generate,
    "agentic": agentic.generate,
    "fewshot": fewshot.generate,
    "random": synthetic.generate,
}
WORKLOADS = (*GENERATORS, "trace")


def build(name: str, n: int | None, seed: int = 0, trace_path: str | None = None,
          **options) -> list[RequestSpec]:
    """The requests of workload ``name``.

    Args:
        name: one of ``WORKLOADS``.
        n: number of requests (for ``trace``: at most this many lines; None = all).
        seed: the seed; equal seeds give equal requests.
        trace_path: the JSONL file (``trace`` only).
        options: workload-specific knobs (see each module).
    """
    if name == "trace":
        if trace_path is None:
            raise ValueError("workload 'trace' needs a trace file (--trace FILE)")
        _check_options(trace.load, name, options)
        return trace.load(trace_path, n, seed, **options)
    gen = GENERATORS.get(name)
    if gen is None:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    if trace_path is not None:
        raise ValueError(f"--trace is only meaningful with workload 'trace', not {name!r}")
    _check_options(gen, name, options)
    return gen(n if n is not None else 200, seed, **options)


def _check_options(fn: Callable, name: str, options: dict) -> None:
    params = inspect.signature(fn).parameters
    known = [p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY
             or p == "ms_per_step"]
    bad = sorted(set(options) - set(known))
    if bad:
        raise ValueError(f"workload {name!r} has no option(s) {bad}; it takes {known}")


__all__ = ["build", "WORKLOADS", "GENERATORS"]
