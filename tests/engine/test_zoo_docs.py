"""docs/zoo.md's command per fault is the run tests/engine/test_zoo.py proves catches it: the
same settings as tests/kits/zookit.py, through the CLI's own parser (so a renamed flag or a
changed setting shows here, not to a user whose run never fires)."""

from __future__ import annotations

import shlex
from pathlib import Path

from radixscope.engine.cli import build_parser
from tests.kits.zookit import L3_COLD, L3_STORE, ZOO

ROOT = Path(__file__).resolve().parents[2]


def _commands() -> list[list[str]]:
    text = (ROOT / "docs" / "zoo.md").read_text()
    section = text[text.index("## Running each fault from the command line"):]
    block = section[section.index("```bash\n") + 8:]
    block = block[:block.index("```")].replace("\\\n", " ")
    return [shlex.split(line) for line in block.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_every_fault_has_the_command_its_engine_test_runs():
    cmds = _commands()
    by_name = {}
    for i, argv in enumerate(cmds):
        assert argv[:2] == ["radixscope", "run"], argv
        ns = build_parser().parse_args(argv[1:])
        if ns.inject is not None:
            by_name[ns.inject] = (i, ns)
    assert sorted(by_name) == sorted(ZOO)
    for name, (settings, _rule, _op) in ZOO.items():
        i, ns = by_name[name]
        for key, want in settings.items():
            if key == "sizes":
                for size, n in want.items():
                    assert getattr(ns, size) == n, (name, size)
            elif key == "storage":
                assert ns.storage.startswith("file:"), name
                if want == L3_STORE:  # a clean run of the same settings fills the store first
                    warm = build_parser().parse_args(cmds[i - 1][1:])
                    assert warm.inject is None and warm.storage == ns.storage, name
                    assert {k: v for k, v in vars(warm).items() if k not in ("inject", "store")} \
                        == {k: v for k, v in vars(ns).items() if k not in ("inject", "store")}
                else:
                    assert want == L3_COLD
                    assert all(b.storage != ns.storage for _, b in by_name.values()
                               if b is not ns), f"{name}: its L3 store must start empty"
            else:
                assert getattr(ns, key) == want, (name, key)
