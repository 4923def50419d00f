"""Every workload x component set, at a small size, with ``check()`` after every step.

Each run must finish every request with no invariant violation and no content mismatch (the
engine verifies every reused prefix against the stand-in model), and must exercise eviction,
host backup and load-back. Across all runs, no request whose admission passed may run out of
memory in its load-back or first prefill chunk.
"""

from __future__ import annotations

import pytest

from radixscope.engine.run import RunResult, RunSpec, execute
from radixscope.engine.workloads import trace

COMPONENT_SETS = {"full": ("full",), "swa": ("full", "swa"), "mamba": ("full", "mamba"),
                  "hybrid": ("full", "swa", "mamba")}
# workload -> (requests, generator options, pool sizes); small, but tight enough to evict
CASES = {
    "chat": (24, dict(turns=(2, 4), think=(2, 8), mean_gap=2.0, system_len=(96, 192),
                      user_len=(16, 48), answer_len=(8, 32)),
             dict(page_size=1, device_tokens=768, host_tokens=1536)),
    "agentic": (18, dict(iterations=(3, 5), tool_len=(32, 128), preamble_len=(128, 256),
                         task_len=(16, 48), action_len=(8, 24), mean_gap=3.0, tool_time=(1, 4)),
                dict(page_size=4, device_tokens=1024, host_tokens=2048)),
    "fewshot": (30, dict(tasks=6, examples=(3, 5), example_len=(24, 64), answer_len=(4, 16),
                         mean_gap=1.0), dict(page_size=2, device_tokens=512, host_tokens=1024)),
    "random": (30, dict(prompt_len=(32, 192), resubmit=0.6, mean_gap=1.0, answer_len=(4, 24)),
               dict(page_size=1, device_tokens=512, host_tokens=1024)),
    "trace": (30, {}, dict(page_size=4, device_tokens=512, host_tokens=1024)),
}
RUNS: list[RunResult] = []


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "sample.jsonl"
    return str(trace.write_sample(path, 30, seed=1, block_size=16, documents=6, mean_gap=1.0))


def small_spec(workload: str, components: str, trace_path: str | None = None,
               **over) -> RunSpec:
    n, options, sizes = CASES[workload]
    sizes = dict(sizes)
    if "swa" in COMPONENT_SETS[components]:
        sizes.update(swa_device_tokens=sizes["device_tokens"] // 2,
                     swa_host_tokens=sizes["host_tokens"] // 2)
    if "mamba" in COMPONENT_SETS[components]:
        sizes.update(mamba_slots=12, mamba_host_slots=24)
    kw = dict(workload=workload, requests=n, components=COMPONENT_SETS[components], store=None,
              check_invariants=True, chunk_tokens=64, prefill_budget=128, max_running=6,
              sizes=sizes, workload_options=options,
              trace=trace_path if workload == "trace" else None)
    kw.update(over)
    return RunSpec(**kw)


def assert_clean(r: RunResult, n: int) -> None:
    e, c = r.engine, r.counter
    assert r.error is None, r.error
    assert (len(e.done), len(e.rejected)) == (n, 0)
    assert e.admitter.budget_violations == []
    assert e.admitter.verified > 0 and e.admitter.admitted >= n
    assert sum(v for (_comp, tier), v in c.evictions.items() if tier == "device") > 0
    assert c.transfers["backup"] > 0
    assert c.transfers["load_back"] > 0


@pytest.mark.parametrize("components", list(COMPONENT_SETS))
@pytest.mark.parametrize("workload", list(CASES))
def test_workload_runs_clean(workload, components, trace_file):
    r = execute(small_spec(workload, components, trace_file))
    RUNS.append(r)
    assert_clean(r, CASES[workload][0])
    comps = COMPONENT_SETS[components]
    assert r.config.components == comps
    for comp in comps[1:]:  # auxiliary components are evicted and loaded back too
        assert r.counter.evictions[(comp, "device")] > 0
        assert r.counter.moved[("backup", comp)] > 0


@pytest.mark.parametrize("workload,components,policy", [
    ("chat", "hybrid", "write_back"), ("agentic", "swa", "write_through_selective"),
    ("fewshot", "mamba", "write_back")])
def test_write_policies(workload, components, policy, trace_file):
    r = execute(small_spec(workload, components, trace_file, write_policy=policy))
    RUNS.append(r)
    assert r.config.write_policy == policy
    assert_clean(r, CASES[workload][0])


@pytest.mark.parametrize("workload,components", [("chat", "hybrid"), ("agentic", "swa"),
                                                  ("fewshot", "mamba")])
def test_no_admitted_request_ran_out_of_memory(workload, components, trace_file):
    """Admission's promise holds for the load-back and first chunk of every admitted request
    (the engine verifies each and counts a failure instead of crashing the run), on runs of
    its own that evict, back up and load back under memory pressure."""
    r = execute(small_spec(workload, components, trace_file, check_invariants=False))
    a = r.engine.admitter
    assert r.error is None, r.error
    assert a.admitted >= len(r.engine.done) == CASES[workload][0]
    assert a.verified > 0  # reused prefixes were checked against the model
    assert r.counter.transfers["load_back"] > 0  # including admissions that load back
    assert a.budget_violations == []


def test_runs_are_deterministic(trace_file):
    """On the CPU a transfer's copies run at the poll that acks it, so a run is a function of
    its settings. (Under CUDA a poll acks only the copies the side stream has finished, so
    which step a load-back lands in, and what follows, varies with timing.)"""
    a = execute(small_spec("fewshot", "hybrid", trace_file, check_invariants=False,
                           device="cpu"))
    b = execute(small_spec("fewshot", "hybrid", trace_file, check_invariants=False,
                           device="cpu"))
    assert a.error is None and b.error is None
    assert {k: len(v) for k, v in a.counter.op_ns.items()} == \
        {k: len(v) for k, v in b.counter.op_ns.items()}
    assert a.counter.evicted == b.counter.evicted and a.counter.moved == b.counter.moved
    assert [(s.rid, s.device_hit, s.host_hit, s.admitted_step) for s in a.engine.done] == \
        [(s.rid, s.device_hit, s.host_hit, s.admitted_step) for s in b.engine.done]
