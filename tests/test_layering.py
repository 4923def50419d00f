"""The dependency direction of DESIGN.md, read from the imports themselves."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names)
PROJECT = {"cache", "telemetry", "engine", "ui"}

# package -> (allowed third-party top-level modules, allowed project packages, forbidden prefixes)
RULES = {
    "cache": ({"torch", "opentelemetry"}, {"cache"}, ("opentelemetry.sdk", "opentelemetry.exporter")),
    "telemetry": ({"torch", "opentelemetry", "pandas", "numpy", "pyarrow", "prometheus_client",
                   "google", "grpc", "zmq", "msgspec"}, {"cache", "telemetry"}, ("streamlit",)),
    "engine": ({"torch", "opentelemetry", "pandas", "numpy"}, {"cache", "telemetry", "engine"},
               ("streamlit",)),
    "ui": ({"streamlit", "pandas", "numpy", "plotly", "networkx", "graphviz", "torch",
            "opentelemetry"}, {"ui", "telemetry", "cache"}, ()),
}
# storage backends may import their own client library, lazily (inside a function) only
STORAGE_CLIENTS = {"cache/storage/redis_backend.py": {"redis"},
                   "cache/storage/mooncake_backend.py": {"mooncake"}}


def top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def lazy_client(path: Path, mod: str) -> bool:
    clients = STORAGE_CLIENTS.get(str(path.relative_to(ROOT)), set())
    return mod.split(".")[0] in clients and mod not in top_level_imports(path)


def imports_of(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def allowed(package: str, mod: str) -> bool:
    third, project, forbidden = RULES[package]
    top = mod.split(".")[0]
    if any(mod == f or mod.startswith(f + ".") for f in forbidden):
        return False
    if top in PROJECT:
        return top in project
    return top in STDLIB or top in third


def violations(package: str) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line} imports {mod}"
            for path in sorted((ROOT / package).rglob("*.py"))
            for line, mod in imports_of(path)
            if not allowed(package, mod) and not lazy_client(path, mod)]


@pytest.mark.parametrize("package", sorted(RULES))
def test_dependency_direction(package: str) -> None:
    if not (ROOT / package).is_dir():
        pytest.skip(f"{package}/ not present")
    assert violations(package) == []


def test_checker_catches_a_wrong_import(tmp_path: Path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text("import streamlit\nfrom opentelemetry.sdk.trace import TracerProvider\n"
                   "import torch\nfrom telemetry import setup\n")
    found = [m for _, m in imports_of(bad)]
    assert found == ["streamlit", "opentelemetry.sdk.trace", "torch", "telemetry"]
    assert [m for m in found if not allowed("cache", m)] == [
        "streamlit", "opentelemetry.sdk.trace", "telemetry"]


def test_storage_clients_are_imported_lazily(tmp_path: Path) -> None:
    for rel, clients in STORAGE_CLIENTS.items():
        path = ROOT / rel
        if path.exists():
            assert not {m.split(".")[0] for m in top_level_imports(path)} & clients, rel
