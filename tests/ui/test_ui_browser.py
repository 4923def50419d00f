"""The UI in a real browser: ``radixscope ui STORE --port N`` on a free local port over a
generated store, headless Debian chromium driven by playwright. Saves screenshots under
``test-artifacts/`` (``ui-tree.png``: the tree; ``ui-tree-node.png``: after clicking a sector)."""

from __future__ import annotations

import contextlib
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


@pytest.fixture(scope="module")
def storage_server(tmp_path_factory):
    store = tmp_path_factory.mktemp("ui-browser-l3") / "run.db"
    facts = make_store(store, storage=True)
    with radixscope_ui(store, tmp_path_factory.mktemp("ui-log")) as url:
        yield url, facts


def test_tree_page_renders_and_drills_down(server):
    url, facts = server
    anchor = facts["held_lock"].anchor
    with _tree_page(url) as page:
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


@contextlib.contextmanager
def _tree_page(url: str):
    """A chromium page on the UI's tree page, once its icicle is drawn."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1500})
            page.goto(url)
            page.wait_for_selector(".iciclelayer g.slice", timeout=120_000)
            yield page
        finally:
            browser.close()


def _rgb(hex_colour: str) -> str:
    h = hex_colour.lstrip("#")
    return "rgb(" + ", ".join(str(int(h[i:i + 2], 16)) for i in (0, 2, 4)) + ")"


def test_storage_is_drawn_in_its_own_colour_with_a_legend(storage_server):
    """A store whose nodes are also in L3: the legend names the storage states and the
    icicle fills sectors with the storage colour family."""
    from radixscope.ui.shaping import states as st_

    url, facts = storage_server
    assert facts["stores"] > 0
    with _tree_page(url) as page:
        assert page.locator('[data-testid="stException"]').count() == 0
        for state in (st_.HOST_STORED, st_.BOTH_STORED):
            chip = page.locator(f'span[title="{st_.MEANING[state]}"]')
            chip.first.wait_for(timeout=30_000)
            assert chip.first.inner_text() == state
        surfaces = page.locator(".iciclelayer path.surface")
        fills = {surfaces.nth(i).evaluate("e => getComputedStyle(e).fill")
                 for i in range(surfaces.count())}
        assert _rgb(st_.COLORS[st_.HOST_STORED]) in fills
        assert _rgb(st_.COLORS[st_.BOTH_STORED]) in fills
        page.mouse.move(0, 0)
        page.screenshot(path=str(ARTIFACTS / "ui-tree-storage.png"), full_page=True)
