"""Workloads are seeded and deterministic, and have the sharing structure they promise."""

from __future__ import annotations

import json

import pytest

from radixscope.engine import workloads
from radixscope.engine.request import RequestSpec
from radixscope.engine.workloads import trace


def _shape(reqs: list[RequestSpec]) -> list[tuple]:
    return [(r.rid, len(r.tokens), r.prompt_len, r.arrival, r.after, r.delay) for r in reqs]


def test_chat_turns_extend_the_conversation():
    reqs = workloads.build("chat", 8, seed=0)
    assert _shape(reqs)[:5] == [
        ("chat-0-0", 472, 417, 0, None, 0), ("chat-0-1", 570, 520, 0, "chat-0-0", 13),
        ("chat-0-2", 647, 625, 0, "chat-0-1", 8), ("chat-0-3", 751, 705, 0, "chat-0-2", 39),
        ("chat-1-0", 500, 445, 10, None, 0)]
    by = {r.rid: r for r in reqs}
    for k in (1, 2, 3):  # turn k's prompt = all of turn k-1 (prompt + answer) + a user message
        prev, cur = by[f"chat-0-{k - 1}"], by[f"chat-0-{k}"]
        assert cur.prompt[:len(prev.tokens)] == prev.tokens
    systems = {r.tokens[:192] for r in reqs if r.after is None}
    assert len(systems) <= 4  # conversations start from a few shared system prompts


def test_agentic_contexts_grow_with_tool_outputs():
    reqs = workloads.build("agentic", 8, seed=0)
    assert [(r.rid, len(r.tokens)) for r in reqs] == [
        ("agent-0-0", 599), ("agent-0-1", 729), ("agent-0-2", 823), ("agent-1-0", 507),
        ("agent-1-1", 743), ("agent-1-2", 977), ("agent-2-0", 586), ("agent-2-1", 736)]
    for a, b in zip(reqs[:2], reqs[1:3], strict=True):
        assert b.prompt[:len(a.tokens)] == a.tokens and b.prompt_len > len(a.tokens)
    by = {r.rid: r for r in workloads.build("agentic", 30, seed=0)}
    assert by["agent-0-0"].tokens[:384] == by["agent-2-0"].tokens[:384]  # two preambles,
    assert by["agent-0-0"].tokens[:384] != by["agent-1-0"].tokens[:384]  # taken in turn


def test_fewshot_shares_example_blocks():
    reqs = workloads.build("fewshot", 40, seed=0, tasks=3)
    starts = {r.tokens[:24] for r in reqs}
    assert len(starts) == 3
    assert [r.arrival for r in reqs[:8]] == sorted(r.arrival for r in reqs[:8])


def test_random_resubmits_prefixes():
    reqs = workloads.build("random", 30, seed=0, resubmit=0.5)
    shared = sum(1 for i, r in enumerate(reqs) if any(
        r.tokens[:32] == p.tokens[:32] for p in reqs[:i]))
    assert shared == 15
    assert _shape(reqs)[:2] == [("random-0", 534, 501, 0, None, 0),
                                ("random-1", 685, 654, 0, None, 0)]


@pytest.mark.parametrize("name", ["chat", "agentic", "fewshot", "random"])
def test_seeded_and_deterministic(name):
    a, b = workloads.build(name, 12, seed=5), workloads.build(name, 12, seed=5)
    assert a == b and len(a) == 12
    assert workloads.build(name, 12, seed=6) != a


def test_trace_lines(tmp_path):
    f = tmp_path / "t.jsonl"
    lines = [{"arrival": 3, "tokens": [1, 2, 3], "output_tokens": [9, 9]},
             {"timestamp": 250, "input_length": 20, "hash_ids": [7, 8], "block_size": 8,
              "output_length": 4, "id": "x"},
             {"input_length": 12, "hash_ids": [7], "block_size": 8, "extra_key": "lora"}]
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    reqs = trace.load(f, seed=0)
    assert _shape(reqs) == [("trace-0", 5, 3, 3, None, 0), ("x", 24, 20, 25, None, 0),
                            ("trace-2", 28, 12, 0, None, 0)]
    assert reqs[0].tokens == (1, 2, 3, 9, 9)
    assert reqs[1].tokens[:8] == reqs[2].tokens[:8]  # same leading block id, same block
    assert reqs[1].tokens[8:16] != reqs[2].tokens[8:16]
    assert reqs[2].extra_key == "lora"
    assert trace.load(f, n=1) == reqs[:1]


@pytest.mark.parametrize("line,message", [
    ("{not json", "t.jsonl:2: not valid JSON"),
    ('{"arrival": 1}', "t.jsonl:2: missing 'input_length'"),
    ('{"input_length": 4, "output_length": -1}', "t.jsonl:2: output_length=-1 must be an "
                                                 "integer >= 0"),
    ('{"tokens": [1, -2]}', "t.jsonl:2: 'tokens' must be a list of token ids >= 0"),
    ('{"tokens": [1], "id": "trace-0"}', "t.jsonl:2: duplicate request id 'trace-0'"),
    ("[1, 2]", "t.jsonl:2: expected a JSON object, got list"),
])
def test_trace_errors_name_the_line(tmp_path, line, message):
    f = tmp_path / "t.jsonl"
    f.write_text('{"tokens": [1, 2]}\n' + line + "\n")
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        trace.load(f)


def test_sample_trace_shares_documents(tmp_path):
    f = trace.write_sample(tmp_path / "s.jsonl", 20, seed=0, block_size=16)
    reqs = trace.load(f)
    assert len(reqs) == 20
    firsts = [r.tokens[:16] for r in reqs]
    assert len(set(firsts)) < 20  # popular documents recur


def test_build_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="unknown workload 'nope'; choose one of chat, agentic, "
                                         "fewshot, random, trace"):
        workloads.build("nope", 3)
    with pytest.raises(ValueError, match="needs a trace file"):
        workloads.build("trace", 3)
    with pytest.raises(ValueError, match="only meaningful with workload 'trace'"):
        workloads.build("chat", 3, trace_path="x.jsonl")
    with pytest.raises(ValueError, match=r"workload 'chat' has no option\(s\) \['bogus'\]"):
        workloads.build("chat", 3, bogus=1)
    with pytest.raises(ValueError, match="requests=0: must be an int >= 1"):
        workloads.build("random", 0)
    with pytest.raises(ValueError, match="does not exist"):
        workloads.build("trace", 3, trace_path=str(tmp_path / "missing.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="holds no requests"):
        workloads.build("trace", None, trace_path=str(tmp_path / "empty.jsonl"))
