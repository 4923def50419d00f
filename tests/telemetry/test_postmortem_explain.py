"""The miss explainer on scripted scenarios: one per reason, with the exact node, seq and op."""

from __future__ import annotations

import pytest

from radixscope.cache import HiRadixCache
from radixscope.telemetry.analysis.load import load_bundle
from radixscope.telemetry.analysis.miss.explain import explain_miss, explain_requests
from radixscope.telemetry.capture.bundle import write_bundle
from radixscope.telemetry.capture.flight import KeyframedFlightRecorder
from tests.kits.cachekit import Driver, make_config

A = list(range(10))


def cache(**kw) -> tuple[HiRadixCache, Driver]:
    c = HiRadixCache(make_config(**kw), recorder=KeyframedFlightRecorder(capacity=1024))
    return c, Driver(c)


def explain(c: HiRadixCache, tmp_path, req_id: str, **kw):
    path = write_bundle(c, tmp_path / f"{req_id}-{c.seq}.db")
    return explain_miss(load_bundle(path), req_id, **kw)


def facts(x) -> list[tuple]:
    return [(r.code, r.component, r.tier, r.node, r.seq, r.op_id) for r in x.reasons]


def test_evicted_from_device_with_no_host_copy(tmp_path):
    c, d = cache(device_tokens=16, host_tokens=0)
    d.insert(A, req_id="r1")
    c.alloc(16, req_id="hog")  # evicts node 1 (unbacked: deleted)
    c.match_prefix(A, req_id="r2")
    x = explain(c, tmp_path, "r2", tokens=A)
    assert (x.key_len, x.device_len, x.host_len, x.full_len) == (10, 0, 0, 0)
    # seq: the node.delete (an eviction records its pool counts once, after its deletions)
    assert facts(x) == [("evicted", "full", "host", 1, 7, 6)]
    assert x.reasons[0].text == ("node 1 (key tokens [0, 10)) was evicted from device (it had no "
                                 "host copy) at seq 7 by alloc (op 6, req hog)")
    assert x.consistent and not x.hit


def test_evicted_to_host_then_from_host(tmp_path):
    c, d = cache(device_tokens=16, host_tokens=32)
    d.insert(A, req_id="r1")
    c.poll(wait=True)
    c.evict(10, req_id="ev")
    c.match_prefix(A, req_id="r2")
    x = explain(c, tmp_path, "r2", tokens=A)
    assert (x.device_len, x.host_len) == (0, 10)
    assert facts(x) == [("evicted", "full", "device", 1, 15, 7)]
    assert x.reasons[0].text.endswith("by evict (op 7, req ev); a load-back can restore it")
    c.evict_host(10, req_id="evh")
    c.match_prefix(A, req_id="r3")
    x = explain(c, tmp_path, "r3", tokens=A)
    assert facts(x) == [("evicted", "full", "host", 1, 18, 9)]
    assert "was evicted from host at seq 18 by evict_host (op 9, req evh)" in x.reasons[0].text


def test_eviction_cascade_names_the_leaf_that_started_it(tmp_path):
    c, d = cache(device_tokens=16, host_tokens=0)
    d.insert(A, req_id="a")
    d.insert(A[:4] + [50, 51], req_id="b")  # splits node 1: node 2 = A[:4], node 1 = A[4:]
    c.alloc(16, req_id="hog")  # evicts leaves 1 and 3, then their childless parent 2
    c.match_prefix(A, req_id="q")
    x = explain(c, tmp_path, "q", tokens=A)
    assert [(r.code, r.node, r.detail()["cause_node"]) for r in x.reasons] == [
        ("evicted", 2, 3)]
    assert x.reasons[0].text.endswith(", cascading from the eviction of node 3")


def test_swa_tombstone_in_the_window(tmp_path):
    """A fresh 20-token leaf is capped at one window (6): node 1 = tokens [0, 14) FULL-only (it
    never held SWA), node 2 = [14, 20) with SWA. A match ending at token 12 has no window."""
    c, d = cache(components=("full", "swa"), device_tokens=64, host_tokens=0, sliding_window=6)
    d.insert(list(range(20)), req_id="a")
    c.match_prefix(list(range(12)), req_id="q")
    x = explain(c, tmp_path, "q", tokens=list(range(12)))
    assert (x.device_len, x.host_len, x.full_len) == (0, 0, 12)
    assert facts(x) == [("swa_tombstone", "swa", "host", 1, None, None)]
    assert x.reasons[0].text == (
        "the SWA window of 6 tokens behind token 12 (node 1) crosses node 1 (key tokens [0, 12)),"
        " whose SWA KV is a tombstone (never held it: created at seq 4 by insert (op 5, req a)); "
        "only 0 token(s) of SWA data follow it; the match fell back to node 0 (token 0)")


def test_swa_window_tombstoned_under_swa_pressure_full_still_resident(tmp_path):
    """SWA pressure tombstones the leaf's window (node 2) and keeps its FULL KV on device."""
    c, d = cache(components=("full", "swa"), device_tokens=64, host_tokens=0, sliding_window=6)
    d.insert(list(range(20)), req_id="a")
    c.evict(4, component="swa", req_id="ev")
    c.match_prefix(list(range(20)), req_id="q")
    x = explain(c, tmp_path, "q", tokens=list(range(20)))
    assert (x.device_len, x.host_len, x.full_len) == (0, 0, 20)
    assert facts(x) == [("swa_pressure", "swa", "host", 2, 12, 7)]
    assert x.reasons[0].text == (
        "the SWA window of 6 tokens behind token 20 (node 2) crosses node 2 (key tokens [14, 20)),"
        " whose SWA window was tombstoned under SWA pressure at seq 12 by evict (op 7, req ev); "
        "its FULL KV is still resident on device (an insert of this prefix heals it); the match "
        "fell back to node 0 (token 0)")


def test_no_mamba_state_at_a_split_boundary(tmp_path):
    c, d = cache(components=("full", "mamba"), device_tokens=64, host_tokens=128)
    d.insert(A, req_id="a")
    d.insert(A[:5] + [50 + i for i in range(5)], req_id="b")  # b's match splits node 1 at 5
    c.match_prefix(A[:5], req_id="q1")
    x = explain(c, tmp_path, "q1", tokens=A[:5])
    assert facts(x) == [("no_mamba_state", "mamba", "host", 2, None, None)]
    assert x.reasons[0].text == (
        "node 2 (ending at token 5) has no MAMBA state (never held it: created by a split at "
        "seq 16 by match (op 7, req b)); the match fell back to node 0 (token 0)")
    c.match_prefix(A[:7], req_id="q2")  # ends inside node 1: this match splits it
    x = explain(c, tmp_path, "q2", tokens=A[:7])
    assert facts(x) == [("no_mamba_state", "mamba", "host", 1, None, None)]
    assert x.reasons[0].detail() == {"end": 7, "split_at": 2}


def test_mamba_state_evicted_to_host_while_full_stays(tmp_path):
    c, d = cache(components=("full", "mamba"), device_tokens=64, host_tokens=128)
    d.insert(A, req_id="a")  # node 1 = A, state at token 10
    d.insert(A + [50, 51, 52], req_id="b")  # node 2 = the tail: node 1 becomes internal
    c.poll(wait=True)
    r2 = c.lock(2, owner="x")  # MAMBA pins the anchor only: node 1's state stays evictable
    c.evict(1, component="mamba", req_id="ev")  # tombstones node 1's device state
    c.unlock(r2)
    c.match_prefix(A, req_id="q")
    x = explain(c, tmp_path, "q", tokens=A)
    assert (x.device_len, x.host_len, x.full_len) == (0, 10, 10)
    assert facts(x) == [("evicted", "mamba", "device", 1, 39, 16)]
    assert x.reasons[0].text == ("node 1 (ending at token 10) has its MAMBA state on host only "
                                 "since seq 39 (evict (op 16, req ev)); the match fell back to "
                                 "node 0 (token 0)")


def test_namespace_mismatch(tmp_path):
    c, d = cache()
    d.insert(A, extra_key="lora-a", req_id="a")
    c.match_prefix(A, extra_key="lora-b", req_id="q")
    x = explain(c, tmp_path, "q", tokens=A)
    assert facts(x) == [("namespace_mismatch", "full", "host", None, None, None)]
    assert x.reasons[0].detail() == {"namespace": "lora-a", "other_tokens": 10, "tokens": 0}
    assert x.extra_key == "lora-b"


def test_page_alignment_of_the_key_tail_and_of_a_mid_page_divergence(tmp_path):
    c, d = cache(page_size=4)
    d.insert(list(range(16)), req_id="a")
    q = list(range(10)) + [99, 99, 7, 7]  # 14 tokens: 12 whole pages; shares 10 with node 1
    c.match_prefix(q, req_id="q")
    x = explain(c, tmp_path, "q", tokens=q)
    assert (x.key_len, x.device_len) == (12, 8)
    assert facts(x) == [("page_alignment", "full", "host", None, None, None),
                        ("page_alignment", "full", "host", 1, None, None)]
    assert [r.detail()["lost_tokens"] for r in x.reasons] == [2, 2]


def test_not_cached(tmp_path):
    c, d = cache()
    d.insert(A, req_id="a")
    c.match_prefix(A[:4] + [77] * 4, req_id="q")
    x = explain(c, tmp_path, "q", tokens=A[:4] + [77] * 4)
    assert (x.device_len, x.full_len) == (4, 4)
    assert facts(x) == [("not_cached", "full", "host", None, None, None)]
    assert x.reasons[0].text == ("no node in the default namespace held the key past token 4 "
                                 "(journal searched from seq 0)")


def test_full_hit_has_no_reasons(tmp_path):
    c, d = cache()
    d.insert(A, req_id="a")
    c.match_prefix(A, req_id="q")
    x = explain(c, tmp_path, "q", tokens=A)
    assert x.hit and x.reasons == () and x.text().endswith("a full hit.")


def test_the_key_is_found_without_tokens(tmp_path):
    c, d = cache(device_tokens=16, host_tokens=32)
    d.insert(A, req_id="r1")
    c.poll(wait=True)
    c.evict(10, req_id="ev")
    c.match_prefix(A, req_id="r2")  # host hit of the whole key: its best node spells it
    d.insert(A[:3] + [40] * 5, req_id="r3")  # r3 matched, then inserted its key
    r = load_bundle(write_bundle(c, tmp_path / "b.db"))
    assert explain_miss(r, "r2").tokens_source == "match op best node"
    x3 = explain_miss(r, "r3")
    assert x3.tokens_source.startswith("insert op ") and x3.key_len == 8
    table = explain_requests(r, ["r2", "r3", "nobody"])
    assert table["reasons"].tolist()[:2] == ["evicted(full/device)",
                                             "not_cached(full/host), evicted(full/device)"]
    assert table["text"].iloc[2].startswith("not explained: request 'nobody' has no match op")
    with pytest.raises(ValueError, match="tokens has 3 entries but request 'r2' matched a key "
                                         "of 10 tokens"):
        explain_miss(r, "r2", tokens=A[:3])


@pytest.mark.parametrize("components", [("full", "swa"), ("full", "mamba")])
@pytest.mark.parametrize("fill", [True, False])
def test_a_branching_point_says_whether_the_request_filled_it_in(tmp_path, components, fill):
    """Two conversations over one 12-token prompt: the second's match stops short of the
    prompt (no window / state at its end) and reports a branching point at 12. The explanation
    names the insert that filled it in, or says no insert did (an engine that drops
    ``branch_len``), and what that costs the next request."""
    prompt = list(range(100, 112))
    c, d = cache(components=components, device_tokens=128, host_tokens=0, sliding_window=4,
                 mamba_slots=16)
    d.insert(prompt + [1, 2, 3, 4], req_id="a", branching=fill)
    res = d.insert(prompt + [5, 6, 7, 8], req_id="b", branching=fill)
    x = explain(c, tmp_path, "b", tokens=prompt + [5, 6, 7, 8])
    assert (x.device_len, x.branch_len) == (0, 12)
    ins = [o for o in c.recorder.tail()[0] if o.op == "insert" and o.req_id == "b"][0]
    if fill:
        assert (x.branch_filled_by, x.branch_node) == (ins.op_id, res.branch_node)
        assert x.text().endswith(f"insert op {ins.op_id} kept the SWA window / MAMBA state "
                                 f"there (node {res.branch_node})")
    else:
        assert (x.branch_filled_by, x.branch_node) == (None, None)
        assert "no later insert of this request filled it in" in x.text()
    d.insert(prompt + [9, 9, 9, 9], req_id="c", branching=fill)
    xc = explain(c, tmp_path, "c", tokens=prompt + [9, 9, 9, 9])
    assert xc.device_len == (12 if fill else 0)
    assert xc.branch_len == (0 if fill else 12)
    r = load_bundle(write_bundle(c, tmp_path / "t.db"))
    assert explain_requests(r, ["b", "c"])["branch_len"].tolist() == [12, 0 if fill else 12]
