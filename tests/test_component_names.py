"""Components own their rules: a component's name ("full", "swa", "mamba") is spelled out only
in ``cache/components/`` and where configuration names them (``CacheConfig`` fields and
presets, CLI flags). Elsewhere code asks the component (``components.rules(name)``,
``Component.valid_prefix`` / ``unit`` / ``is_backbone`` / ``tombstone_meaning``).

``PENDING`` is a ratchet for the modules not yet moved over: their count of literals may only
go down (lower the number when you remove one); any other module must have none."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cache", "telemetry", "ui", "engine")
LITERAL = re.compile(r"""["'](full|swa|mamba)["']""")
ALLOWED = ("cache/components/", "cache/config.py", "engine/cli.py")
# module -> literals still there (only ever lowered)
PENDING = {
    "cache/admission.py": 2, "cache/eviction.py": 1, "cache/guards.py": 2, "cache/hiradix.py": 8,
    "cache/insertion.py": 10, "cache/locks.py": 3, "cache/matching.py": 5, "cache/memory.py": 2,
    "cache/state.py": 2, "cache/storage/results.py": 1, "cache/transfers.py": 4,
    "engine/admit.py": 12, "engine/lifecycle.py": 20, "engine/model.py": 14, "engine/run.py": 13,
    "engine/summary.py": 6, "telemetry/analysis/miss/why.py": 22,
    "telemetry/kvevents/blocks.py": 3, "telemetry/kvevents/ingest.py": 3,
    "telemetry/sinks/metrics.py": 4, "ui/shaping/synthetic.py": 9,
}
# the readers the issue names: they ask the component and must stay free of literals
ASKS_THE_COMPONENT = ("telemetry/analysis/miss/walk.py", "telemetry/analysis/doctor.py",
                      "ui/shaping/budgets.py", "ui/shaping/tree.py", "ui/shaping/states.py")


def _counts() -> dict[str, int]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(ALLOWED):
                continue
            n = len(LITERAL.findall(path.read_text()))
            if n:
                out[rel] = n
    return out


def test_no_component_name_literal_outside_components_and_config():
    grown = {m: (n, PENDING.get(m, 0)) for m, n in _counts().items() if n > PENDING.get(m, 0)}
    assert not grown, ("component-name literals outside cache/components/ (module: (found, "
                       f"allowed)); ask the component instead: {grown}")


def test_the_named_readers_ask_the_component():
    counts = _counts()
    assert {m: counts[m] for m in ASKS_THE_COMPONENT if m in counts} == {}


def test_the_swa_rule_is_the_components():
    from radixscope.cache.components import rules

    swa = rules("swa")
    # a window of 4 behind each end: unbounded from the root, broken by a gap
    steps = [(True, 2), (False, 2), (True, 2), (True, 2), (True, 1)]
    assert swa.valid_prefix(steps, window=4) == [True, False, False, True, True]
    assert rules("full").valid_prefix(steps) == [True, False, True, True, True]
    assert rules("mamba").unit == "states" and rules("full").is_backbone
    assert rules("not-a-component").unit == "tokens"  # foreign stores: base rules
