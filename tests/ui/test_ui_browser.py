"""The UI in a real browser: ``radixscope ui STORE --port N`` on a free local port over a
generated store, headless Debian chromium driven by playwright. Saves screenshots under
``test-artifacts/`` (``ui-tree.png``: the tree; ``ui-tree-node.png``: after clicking a sector)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kits.require import missing
from tests.kits.streamlit_up import radixscope_ui
from tests.kits.ui_store import make_store

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def _chromium() -> None:
    if not Path(CHROMIUM).exists():
        missing("chromium", f"{CHROMIUM} is absent (CI installs Debian's chromium package)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store = tmp_path_factory.mktemp("ui-browser") / "run.db"
    facts = make_store(store)
    with radixscope_ui(store, tmp_path_factory.mktemp("ui-log")) as url:
        yield url, facts


def test_tree_page_renders_and_drills_down(server):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    url, facts = server
    ARTIFACTS.mkdir(exist_ok=True)
    anchor = facts["held_lock"].anchor
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1500})
            page.goto(url)
            page.wait_for_selector(".iciclelayer g.slice", timeout=120_000)
            page.get_by_text("Root", exact=True).wait_for(timeout=60_000)
            sectors = page.locator(".iciclelayer g.slice")
            assert sectors.count() >= 3 * 10  # three components, the same sectors each
            assert page.locator(".iciclelayer path.surface").count() == sectors.count()
            assert page.locator('[data-testid="stException"]').count() == 0
            heading = page.locator("h2").first.inner_text()
            assert heading == f"Radix tree at seq {facts['last_seq']:,}"
            page.mouse.move(0, 0)  # no hover label in the screenshot
            page.screenshot(path=str(ARTIFACTS / "ui-tree.png"), full_page=True)

            # click the FULL sector of the node a request still holds a lock on
            target = page.locator(f'.iciclelayer g.slice:has(text[data-unformatted^='
                                  f'"#{anchor}<br>"])')
            assert target.count() == 3
            target.first.click()
            page.get_by_text(f"Node #{anchor}", exact=True).wait_for(timeout=60_000)
            # the lock holders table names the owner (glide grid: cells are canvas-drawn, the
            # accessible <td> copies are attached but hidden)
            page.get_by_text(facts["held_lock"].owner, exact=True).first.wait_for(
                state="attached", timeout=30_000)
            assert page.locator('[data-testid="stException"]').count() == 0
            page.mouse.move(0, 0)
            page.screenshot(path=str(ARTIFACTS / "ui-tree-node.png"), full_page=True)
        finally:
            browser.close()
