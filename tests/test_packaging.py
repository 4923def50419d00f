"""The wheel, installed alone into a fresh virtual environment, owns only ``radixscope``: a user's
stray ``cache.py`` / ``telemetry.py`` / ``ui.py`` / ``engine.py`` cannot shadow it, the console
script runs, and every module imports from the installed files."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("cache", "telemetry", "engine", "ui")

IMPORT_ALL = """
import importlib, pkgutil, sys
import radixscope
names = ['radixscope']
for m in pkgutil.walk_packages(radixscope.__path__, 'radixscope.'):
    if m.name != 'radixscope.ui.app' and '.app_pages.' not in m.name:  # streamlit scripts
        names.append(m.name)
for n in names:
    mod = importlib.import_module(n)
    assert mod.__file__.startswith(sys.argv[1]), (n, mod.__file__)
for stray in ('cache', 'telemetry', 'engine', 'ui'):
    assert stray not in sys.modules or sys.modules[stray].__file__.endswith(stray + '.py'), stray
print(len(names))
"""


def test_every_package_folder_is_listed_in_pyproject() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    want = {"radixscope"} | {
        "radixscope." + ".".join(p.parent.relative_to(ROOT).parts)
        for f in FOLDERS for p in (ROOT / f).rglob("__init__.py")}
    assert set(cfg["packages"]) == want
    assert cfg["package-dir"] == {"radixscope": "pkgroot",
                                  **{f"radixscope.{f}": f for f in FOLDERS}}


@pytest.mark.slow
def test_the_wheel_in_a_fresh_venv_beside_stray_top_level_modules(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "-q", "-w", str(dist), str(ROOT)], check=True, timeout=600)
    (wheel,) = dist.glob("radixscope-*.whl")
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"radixscope"}
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                    "-q", str(wheel)], check=True, timeout=300)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    work = tmp_path / "work"
    work.mkdir()
    for stray in FOLDERS:  # a user's own modules with our old top-level names
        (work / f"{stray}.py").write_text(f"raise ImportError('stray {stray}.py imported')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    out = subprocess.run([str(py), "-c", IMPORT_ALL, site], cwd=work, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) > 60
    run = subprocess.run([str(env_dir / "bin" / "radixscope"), "run", "--workload", "fewshot",
                          "--requests", "8", "--store", "runs/pkg.db"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert (work / "runs" / "pkg.db").is_file()
