"""The Health page of a bug-zoo run in a real browser (headless chromium, playwright): the
injected class, the op it was caught at, the rule and the node are on the page. Saves
``test-artifacts/zoo-health.png``; with ``RADIXSCOPE_DOCS_SHOTS=1`` also ``docs/zoo-health.png``
(the screenshot docs/zoo.md shows)."""

from __future__ import annotations

import os
import shutil

import pytest

from radixscope.engine.run import execute
from tests.kits.streamlit_up import radixscope_ui
from tests.kits.zookit import ROOT, ZOO, spec
from tests.ui.test_ui_browser import ARGS, ARTIFACTS, CHROMIUM, _chromium  # noqa: F401

pytestmark = pytest.mark.browser
NAME = "lock_evicted_segment"


def test_health_page_names_the_injected_class_op_rule_and_node(tmp_path):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    settings, rule, op = ZOO[NAME]
    store = tmp_path / "run.db"
    r = execute(spec(settings, store), inject=NAME)
    v = r.violation
    assert v["rule"] == rule and v["op"] == op
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "zoo-health.png"
    with radixscope_ui(store, tmp_path) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1300})
            page.goto(f"{url}/health")
            banner = page.get_by_text("Injected fault (bug zoo) class 2", exact=False)
            banner.wait_for(timeout=120_000)
            text = banner.inner_text()
            assert f"Stopped at op {v['op_id']} (`{op}`" not in text  # markdown renders code
            assert f"Stopped at op {v['op_id']} ({op}, request {v['req_id']})" in text
            assert f"rule {rule}, nodes {', '.join(map(str, v['nodes']))}" in text
            page.get_by_text(f"caused by op {v['op_id']}", exact=False).first.wait_for(
                timeout=60_000)
            page.get_by_text("Recorded violations").wait_for(timeout=60_000)
            page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=60_000)
            page.wait_for_function("document.querySelectorAll("
                                   "'[data-testid=\"stSkeleton\"]').length === 0",
                                   timeout=60_000)  # every panel rendered, none still loading
            assert page.locator('[data-testid="stException"]').count() == 0
            page.mouse.move(0, 0)
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    if os.environ.get("RADIXSCOPE_DOCS_SHOTS") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "zoo-health.png")
