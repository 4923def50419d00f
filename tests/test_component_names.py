"""Components own their rules: a component's name ("full", "swa", "mamba") is spelled out only
in ``cache/components/`` and where configuration names them (``CacheConfig`` fields and
presets, CLI flags). Elsewhere code asks the component (``components.rules(name)``,
``Component.valid_prefix`` / ``unit`` / ``is_backbone`` / ``tombstone_meaning``).
Roles are asked for by name: ``components.BACKBONE`` / ``WINDOW`` / ``STATE``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cache", "telemetry", "ui", "engine")
LITERAL = re.compile(r"""["'](full|swa|mamba)["']""")
ALLOWED = ("cache/components/", "cache/config.py", "engine/cli.py")
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
    found = _counts()
    assert not found, ("component-name literals outside cache/components/ and config (module: "
                       f"count); ask the component instead: {found}")


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
