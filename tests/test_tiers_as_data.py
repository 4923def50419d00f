"""Tiers are data: ``cache/tiers.py`` is the one module that lists the tiers or knows how many
there are. This test reads the source of every package and fails on the two-tier patterns the
restructuring removed (and on a hard-coded tier count)."""

from __future__ import annotations

import re
from pathlib import Path

from radixscope.cache.snapshot import EMPTY_STATE, ComponentState
from radixscope.cache.tiers import N_TIERS, TIER_LABELS, TIERS, Tier

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cache", "telemetry", "ui", "engine")
TIERS_MODULE = ROOT / "cache" / "tiers.py"

# (what it means, pattern)
FORBIDDEN = (
    ("tier constants defined as ints", r"\bDEVICE\s*,\s*HOST\s*=\s*0\s*,\s*1\b"),
    ("a tier constant defined as an int", r"^\s*(DEVICE|HOST|STORAGE)\s*=\s*\d"),
    ("a two-slot ledger literal", r"\[\s*\[\s*0\s*,\s*0\s*\]"),
    ("a two-slot list per item", r"\[\s*0\s*,\s*0\s*\]\s+for\b"),
    ("a tier tuple defined outside tiers.py", r"^\s*TIERS\s*=|^\s*TIER_LABELS\s*="),
    ("a tier index computed from a comparison", r"\b0\s+if\s+[^\n]*tier[^\n]*\s+else\s+1\b"),
    ("separate per-tier value fields", r"\bhost_value\b"),
    ("a hard-coded list of the tiers",
     r"\(\s*(ev\.)?TIER_DEVICE\s*,\s*(ev\.)?TIER_HOST\s*\)|\(\s*DEVICE\s*,\s*HOST\s*\)\s*:"),
    ("a hard-coded list of the tier labels", r"""\(\s*["']device["']\s*,\s*["']host["']\s*\)"""),
    ("comp.state read by fixed tier slots", r"""\{\s*["']device["']\s*:\s*0\s*,\s*["']host["']\s*:\s*1"""),
    ("a hard-coded tier count", r"\bN_TIERS\s*=\s*\d|\bn_tiers\s*=\s*\d|range\(\s*2\s*\)"),
)


def _sources():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path != TIERS_MODULE:
                yield path


def test_no_two_tier_assumption_outside_the_tiers_module():
    hits = []
    for path in _sources():
        text = path.read_text()
        for what, pattern in FORBIDDEN:
            for m in re.finditer(pattern, text, re.M):
                line = text.count("\n", 0, m.start()) + 1
                hits.append(f"{path.relative_to(ROOT)}:{line}: {what}: {m.group(0).strip()!r}")
    assert not hits, "two-tier assumptions outside cache/tiers.py:\n" + "\n".join(hits)


def test_the_patterns_catch_what_they_name():
    samples = {
        "DEVICE, HOST = 0, 1": 0, "self.evictable = [[0, 0] for _ in comps]": 2,
        "TIERS = (ev.TIER_DEVICE, ev.TIER_HOST)": 4, "ti = 0 if tier == device else 1": 5,
        "d.host_value": 6, 'for t in ("device", "host"):': 8, 'SLOT = {"device": 0, "host": 1}': 9,
        "for t in range(2):": 10,
    }
    for text, i in samples.items():
        assert re.search(FORBIDDEN[i][1], text, re.M), (text, FORBIDDEN[i][0])


def test_storage_exists_and_is_empty():
    from radixscope.cache import HiRadixCache
    from tests.kits.cachekit import Driver, make_config

    assert [t.label for t in TIERS] == ["device", "host", "storage"] == list(TIER_LABELS)
    assert N_TIERS == len(Tier) and Tier.of("storage") is Tier.STORAGE
    c = HiRadixCache(make_config(("full", "swa", "mamba"), host_tokens=64))
    Driver(c).insert([1, 2, 3, 4, 5, 6])
    c.poll()
    assert Tier.STORAGE not in c.pool_tiers
    assert all(p[Tier.STORAGE] is None for p in c.pools)
    assert all(d.values[Tier.STORAGE] is None and d.refs[Tier.STORAGE] == 0
               for n in c.tree.nodes.values() for d in n.data)
    snap = c.snapshot()
    assert {p.tier for p in snap.pools} == {"device", "host"}
    # every state carries one entry per tier, the storage one empty
    assert all(len(s.lens) == len(s.refs) == N_TIERS and s.length("storage") is None
               for n in snap.nodes for s in n.components)
    c.check()


def test_component_state_has_a_tier_dimension_of_any_size():
    s = ComponentState.on({"device": 4, "host": 4}, {"device": 1})
    assert (s.device_len, s.host_len, s.lock_ref, s.host_ref) == (4, 4, 1, 0)
    assert s.state == "device+host" and EMPTY_STATE.state == "tombstone"
    wide = ComponentState((None, 4, 8, 2), (0, 0, 1, 0))  # a fourth tier: shown, not assumed
    assert wide.tiers == ("host", "storage", "tier3") and wide.length(Tier.STORAGE) == 8
    assert wide.state == "host+storage+tier3" and wide.ref(Tier.STORAGE) == 1
    assert ComponentState.from_value(s.as_tuple()) == s
