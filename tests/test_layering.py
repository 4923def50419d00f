"""The dependency direction of DESIGN.md, read from the imports themselves (the new layout)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names)
R = "radixscope"
TELEMETRY_THIRD = {"torch", "opentelemetry", "pandas", "numpy", "pyarrow", "prometheus_client",
                   "google", "grpc", "zmq", "msgspec"}

# folder -> (allowed third-party top-level modules, allowed project prefixes, forbidden prefixes);
# the most specific folder wins
RULES = {
    # numpy: the slot allocator's page bitmaps and free stack (a call is a few numpy calls
    # instead of a Python loop per page, issue 17); torch's own ``Tensor.numpy`` bridges them
    "cache": ({"torch", "numpy", "opentelemetry"}, (f"{R}.cache",),
              ("opentelemetry.sdk", "opentelemetry.exporter")),
    "telemetry": (TELEMETRY_THIRD, (f"{R}.cache", f"{R}.telemetry"), ("streamlit",)),
    # in the cache's process: the cache's types and its own stage only
    "telemetry/record": ({"opentelemetry"}, (f"{R}.cache", f"{R}.telemetry.record",
                                             f"{R}.telemetry.names"),
                         ("streamlit", "pandas")),
    # the file and what reads it: what the sinks build is never read back from them (the
    # store writer takes the record stage's wire forms; the reader decodes what it stored)
    "telemetry/store": (TELEMETRY_THIRD, (f"{R}.cache", f"{R}.telemetry"),
                        ("streamlit", f"{R}.telemetry.sinks", f"{R}.telemetry.capture",
                         f"{R}.telemetry.analysis")),
    # after the fact: the store, never the live pipeline (record/, sinks/, capture/)
    "telemetry/analysis": (TELEMETRY_THIRD, (f"{R}.cache", f"{R}.telemetry.analysis",
                                             f"{R}.telemetry.store", f"{R}.telemetry.names"),
                           ("streamlit",)),
    "engine": ({"torch", "opentelemetry", "pandas", "numpy"},
               (f"{R}.cache", f"{R}.telemetry", f"{R}.engine"), ("streamlit",)),
    "ui": ({"streamlit", "pandas", "numpy", "plotly", "networkx", "graphviz", "torch",
            "opentelemetry"},
           (f"{R}.ui", f"{R}.cache", f"{R}.telemetry.analysis", f"{R}.telemetry.store",
            f"{R}.telemetry.names"), ()),
}
# storage backends may import their own client library, lazily (inside a function) only
STORAGE_CLIENTS = {"cache/storage/redis_backend.py": {"redis"},
                   "cache/storage/mooncake_backend.py": {"mooncake"}}
# known exceptions, each with its reason (keep this list short)
EXCEPTIONS: set[tuple[str, str]] = set()


def imports_of(path: Path, top_level_only: bool = False, runtime: bool = False
               ) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import (``from a import b``: ``a``, and ``a.b``
    too when that is a module); ``top_level_only`` skips function bodies and TYPE_CHECKING;
    ``runtime`` keeps function-level imports and skips only ``if TYPE_CHECKING:`` blocks
    (what can run, so what can form a circle)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = []
    if top_level_only:
        nodes = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    else:
        typing_only: set[int] = set()
        if runtime:
            for n in ast.walk(tree):
                if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                    typing_only.update(id(x) for b in n.body for x in ast.walk(b))
        nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                 and id(n) not in typing_only]
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif node.level == 0 and node.module:
            if node.module != R:  # `from radixscope import telemetry`: the names below count
                out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                    if _is_module(f"{node.module}.{a.name}")]
    return out


def _file_of(mod: str) -> Path | None:
    parts = mod.split(".")
    if parts[0] != R or len(parts) < 2:
        return None
    base = ROOT.joinpath(*parts[1:])
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _is_module(mod: str) -> bool:
    return _file_of(mod) is not None


def rule_for(rel: Path) -> str:
    best = ""
    for key in RULES:
        if rel.as_posix().startswith(key + "/") and len(key) > len(best):
            best = key
    return best


def allowed(package: str, mod: str) -> bool:
    third, project, forbidden = RULES[package]
    top = mod.split(".")[0]
    if any(mod == f or mod.startswith(f + ".") for f in forbidden):
        return False
    if top == R:
        return mod == f"{R}.telemetry" and package == "ui" or any(
            mod == p or mod.startswith(p + ".") for p in project)
    if top in ("cache", "telemetry", "engine", "ui"):
        return False  # the old import names: never
    return top in STDLIB or top in third


def violations(folder: str) -> list[str]:
    out = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT)
        package = rule_for(rel)
        lazy = STORAGE_CLIENTS.get(rel.as_posix(), set())
        top_level = {m for _, m in imports_of(path, top_level_only=True)} if lazy else set()
        for line, mod in imports_of(path):
            if (rel.as_posix(), mod) in EXCEPTIONS:
                continue
            if mod.split(".")[0] in lazy and mod not in top_level:
                continue
            if not allowed(package, mod):
                out.append(f"{rel}:{line} imports {mod}")
    return out


@pytest.mark.parametrize("folder", ["cache", "telemetry", "engine", "ui"])
def test_dependency_direction(folder: str) -> None:
    assert violations(folder) == []


def test_no_import_circles() -> None:
    """Imports between project modules form no cycle, function-level (lazy) ones included: a
    local import only hides a circle from import time, not from the reader."""
    graph: dict[str, set[str]] = {}
    for folder in ("cache", "telemetry", "engine", "ui"):
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            me = ".".join([R, *parts])
            graph[me] = {m for _, m in imports_of(path, runtime=True)
                         if _is_module(m) and m != me}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    # a package's __init__ importing its own submodules is not a circle
    cycles = [c for c in cycles if not any(a.startswith(b + ".") or b.startswith(a + ".")
                                           for a, b in zip(c, c[1:], strict=False))]
    assert cycles == []


def test_storage_clients_are_imported_lazily() -> None:
    for rel, clients in STORAGE_CLIENTS.items():
        path = ROOT / rel
        assert path.exists(), rel
        assert not {m.split(".")[0] for _, m in imports_of(path, top_level_only=True)} & clients


def _write(tmp: Path, text: str) -> Path:
    p = tmp / "y.py"
    p.write_text(text)
    return p


def test_checker_catches_a_wrong_import(tmp_path: Path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text("import streamlit\nfrom opentelemetry.sdk.trace import TracerProvider\n"
                   "import torch\nfrom radixscope.telemetry import setup\nimport telemetry\n")
    found = [m for _, m in imports_of(bad)]
    assert found == ["streamlit", "opentelemetry.sdk.trace", "torch", "radixscope.telemetry",
                     "radixscope.telemetry.setup", "telemetry"]
    assert [m for _, m in imports_of(_write(tmp_path, "from radixscope import ui\n"))] == [
        "radixscope.ui"]
    assert [m for m in found if not allowed("cache", m)] == [
        "streamlit", "opentelemetry.sdk.trace", "radixscope.telemetry",
        "radixscope.telemetry.setup", "telemetry"]
    assert not allowed("telemetry/analysis", "radixscope.telemetry.sinks.journal")
    assert allowed("telemetry/analysis", "radixscope.telemetry.store.reader")
    assert not allowed("telemetry/record", "radixscope.telemetry.store.writer")
    assert not allowed("telemetry/store", "radixscope.telemetry.sinks.spans")
    assert not allowed("ui", "radixscope.telemetry.sinks.journal")
    assert allowed("ui", "radixscope.telemetry.store.journal")


def test_no_layering_exceptions_remain() -> None:
    assert EXCEPTIONS == set()
