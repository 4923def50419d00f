"""README.md's "Using the cache from your engine" example runs as printed (in its own process,
in an empty folder) and does what its comments say: each turn reuses the conversation so far,
brought back from host after the other conversation evicted it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START = "```python\nimport torch\nfrom radixscope import telemetry\n"


def test_the_readme_engine_example_runs_as_printed(tmp_path):
    text = (ROOT / "README.md").read_text()
    assert START in text, "README.md lost its engine example"
    code = text[text.index(START) + len("```python\n"):]
    code = code[:code.index("```\n")]
    (tmp_path / "example.py").write_text(code)
    p = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[:2] == ["chat0-turn0: 0 of 400 tokens reused, 0 from host",
                         "chat1-turn0: 0 of 400 tokens reused, 0 from host"]
    assert lines[-1] == "chat1-turn3: 600 of 700 tokens reused, 600 from host"
    assert (tmp_path / "runs" / "my.db").is_file()
