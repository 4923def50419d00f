"""The post-mortem notebook, executed against a bundle from an injected fault.

The fault: a leaked lock ref on node 1 (a pin no lock table entry accounts for, ledgers not
moved). The cache still counts node 1 as evictable, so an ``alloc`` that needs it fails with
"eviction could not reach the evictable total": an invariant violation surfacing as an
out-of-memory. The crash hook writes the bundle; the notebook must run clean on it and name the
failing op and node. Parameters are injected the way papermill does (a cell after the one
tagged ``parameters``), executed with nbclient on the ``python3`` kernel.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from radixscope.cache import CacheOutOfMemory, HiRadixCache
from radixscope.cache.tiers import Tier
from radixscope.telemetry.capture.crash import install_crash_bundles
from radixscope.telemetry.capture.flight import KeyframedFlightRecorder
from tests.kits.cachekit import Driver, make_config

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "postmortem.ipynb"


def inject(nb: nbformat.NotebookNode, **params: object) -> None:
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    cell = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in params.items()))
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(at + 1, cell)


def outputs(nb: nbformat.NotebookNode) -> tuple[str, list[str]]:
    text, errors = [], []
    for c in nb.cells:
        for o in c.get("outputs", []):
            if o.output_type == "stream":
                text.append(o.text)
            elif o.output_type == "error":
                errors.append(f"{o.ename}: {o.evalue}")
    return "".join(text), errors


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert "parameters" in code[0].metadata.get("tags", [])
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_notebook_runs_on_a_crash_bundle_and_names_the_failure(tmp_path):
    c = HiRadixCache(make_config(device_tokens=16, host_tokens=64),
                     recorder=KeyframedFlightRecorder(capacity=64))
    d = Driver(c)
    bundler = install_crash_bundles(c, tmp_path / "bundles")
    d.insert(list(range(8)), req_id="r1")
    c.poll(wait=True)
    d.insert([9] * 8, req_id="r2")
    c.poll(wait=True)
    c.node(1).data[0].refs[Tier.DEVICE] += 1  # the injected fault
    c.refresh_leaf(c.node(1))
    with pytest.raises(CacheOutOfMemory):
        c.alloc(16, req_id="big")
    assert len(bundler.written) == 1 and bundler.written[0].exists()

    nb = nbformat.read(NOTEBOOK, as_version=4)
    inject(nb, path=str(bundler.written[0]))
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    text, errors = outputs(nb)
    assert errors == []
    assert "FAILED OP: alloc (op 13, req big) at seq 30" in text
    assert "NODE: 1\n" in text
    assert "  [full.lock_ref] node=1: 1 but the lock table holds 0 pin(s)" in text
    assert "requests involved: ['big', 'r2', 'r1']" in text
    assert "request r2: match (op 7, seq 15) got 0 of 8 tokens on device" in text
