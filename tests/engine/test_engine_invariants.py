"""``--check-invariants``: the first violation stops the run, names the node, the invariant and
the operation after which it was first seen (located by a deterministic re-run that checks after
every cache call), and is recorded in the store."""

from __future__ import annotations

from radixscope.cache.tiers import Tier
from radixscope.engine.doctor import diagnose
from radixscope.engine.run import RunSpec, execute
from radixscope.engine.summary import format_summary, summarize
from radixscope.telemetry import open_store
from radixscope.telemetry.analysis.load import load_bundle

SPEC = dict(workload="fewshot", preset="full", requests=20, check_invariants=True,
            sizes=dict(device_tokens=1024, host_tokens=2048))


def free_a_tree_slot(engine):
    """An engine bug: at step 30, free a slot the tree owns (an unlocked cached node's). The
    cache's ``free`` refuses tree slots, so the buggy engine reaches past it to the pool."""
    c = engine.cache
    if engine.step_no >= 30 and c.d_leaves and not getattr(engine, "_faulted", False):
        engine._faulted = True
        node = c.node(min(c.d_leaves))
        slot = node.data[0].values[Tier.DEVICE][:1]
        c.device_pools[0].alloc.free(slot)
        c.device_pools[0].alloc.mark_tree(slot, False)


def bump_a_lock_ref(engine):
    """State corrupted outside any cache operation, at the end of step 25."""
    if engine.step_no == 25:
        seq = next(s for s in engine.running if s.receipt is not None)
        engine.cache.node(seq.anchor).data[0].refs[Tier.DEVICE] += 1


def test_the_operation_that_broke_it_is_named():
    r = execute(RunSpec(store=None, **SPEC), fault=free_a_tree_slot)
    assert r.error_kind == "invariant" and not r.ok
    v = r.violation
    assert (v["invariant"], v["node"], v["op"], v["call"], v["req_id"], v["step"]) == \
        ("full.device.conservation", None, "match", "match_prefix", "fewshot-3", 32)
    assert ["full.device.slot_freed", 9, "holds freed slots [341]"] in v["violations"]
    assert v["message"].startswith(
        "step 32: invariant full.device.conservation broken (pool-wide), first seen right after "
        "op #99 match (request fewshot-3): free 13 + evictable 371")
    assert r.engine.step_no == 32  # the run stopped at the first check that failed
    text = format_summary(summarize(r))
    assert "  invariants   VIOLATED: step 32: invariant full.device.conservation" in text


def test_the_node_is_named_and_the_violation_is_stored(tmp_path):
    store = tmp_path / "run.db"
    r = execute(RunSpec(store=str(store), telemetry_mode="inline", **SPEC), fault=bump_a_lock_ref)
    assert r.error == ("step 26: invariant full.lock_ref broken at node 2, first seen right "
                       "after op #84 match (request fewshot-3): 2 but the lock table holds 1 "
                       "pin(s)")
    with open_store(store) as reader:
        rows = reader.violations()
    # the crash bundle of the failing check(), then the engine's located report
    assert list(rows["kind"]) == ["exception", "invariant"]
    assert rows["message"][0].startswith("InvariantViolation in check: 1 invariant violation(s):")
    assert rows["message"][1] == r.error
    assert rows["details"][1]["node"] == 2 and rows["details"][1]["op_id"] == 84
    assert len(r.bundles) == 1 and r.bundles[0].parent == tmp_path / "bundles"
    assert rows["details"][1]["bundles"] == [str(r.bundles[0])]
    with load_bundle(r.bundles[0]) as b:
        assert b.failure()["op"] == "check"
    report = diagnose(str(store))
    assert not report.healthy
    assert "  [invariant] at seq " in report.text and "full.lock_ref broken at node 2" in \
        report.text
    assert report.text.endswith("verdict: PROBLEMS FOUND (see above)")


def test_lost_host_data_is_caught_and_bundled(tmp_path):
    """Damage the host copies (a failed DMA, say): the next load-back's verification stops the
    run naming the request and position, and the live cache is bundled for the post-mortem."""
    def corrupt_host(engine):
        if engine.step_no == 60:
            engine.cache.host_pools[0].buf.add_(1.0)

    store = tmp_path / "run.db"
    r = execute(RunSpec(store=str(store), telemetry_mode="inline", **{**SPEC, "workload": "chat"}),
                fault=corrupt_host)
    assert r.error_kind == "content"
    assert r.error == ("content mismatch in request chat-1-2: full KV at token position 441 "
                       f"(slot {r.violation['slot']}) is not what the model wrote for that prefix")
    assert len(r.bundles) == 1
    with open_store(store) as reader:
        rows = reader.violations()
        events = reader.events("bundle")
    assert list(rows["kind"]) == ["content"] and rows["details"][0]["req_id"] == "chat-1-2"
    assert list(events["attrs"])[0]["path"] == str(r.bundles[0])
