"""Span, attribute and metric names: OTel naming rules, and docs/telemetry.md lists exactly them."""

from __future__ import annotations

import re
from pathlib import Path

from radixscope.cache import events as ev
from radixscope.telemetry import names as n

DOC = Path(__file__).resolve().parents[2] / "docs" / "telemetry.md"
PART = r"[a-z][a-z0-9_]*"
NAME = re.compile(rf"^{PART}(\.({PART}|<[a-z_]+>))+$")


def _labels() -> set[str]:
    return {label for labels in n.METRIC_LABELS.values() for label in labels}


def _all_names() -> set[str]:
    return (set(n.all_span_names()) | set(n.all_attribute_names()) | set(n.all_metric_names())
            | _labels())


def test_names_follow_otel_rules():
    for name in _all_names():
        assert NAME.match(name), f"{name!r}: lowercase, dot namespaces, snake_case parts"
        assert not name.startswith("otel."), name
    for name in n.all_span_names():
        assert name.startswith(n.SPAN_PREFIX) and name.count(".") == 1, name


def test_no_attribute_name_is_also_a_namespace():
    attrs = {a.replace(".<component>", ".x").replace(".<key>", ".x")
             for a in (*n.all_attribute_names(), *_labels())}
    for a in attrs:
        clashes = [b for b in attrs if b.startswith(a + ".")]
        assert not clashes, f"{a!r} is an attribute and the namespace of {clashes}"


def test_every_op_and_every_record_key_has_a_name():
    for op in ev.OPS:
        assert n.span_name(op) != n.SPAN_OTHER, op
    keys = [v for k, v in vars(ev).items() if k.startswith("A_")]
    assert set(keys) == set(n.OP_ATTRIBUTES)
    assert n.span_name("frobnicate") == n.SPAN_OTHER
    assert n.attribute_name("match", "Weird Key!") == "kv_cache.attr.weird_key_"


def test_metric_labels_are_low_cardinality():
    for metric, labels in n.METRIC_LABELS.items():
        for label in labels:
            assert "node" not in label and "request" not in label and "receipt" not in label, (
                metric, label)


def test_doc_lists_exactly_the_constants():
    text = DOC.read_text()
    documented = set(re.findall(r"`((?:kv_cache|error)\.[a-z0-9_.<>]+)`", text))
    names = _all_names()
    assert names - documented == set(), "names missing from docs/telemetry.md"
    assert documented - names == set(), "docs/telemetry.md lists names that do not exist"
