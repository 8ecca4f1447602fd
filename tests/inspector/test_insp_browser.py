"""The inspector in a real browser: Debian's headless chromium driven by Playwright.

Starts the app on a database the test fills, opens every page, waits until Streamlit has finished
running the script, and checks that there is no exception box and that every chart drew (a Vega
canvas or SVG). Screenshots go to ``$OPTPIPE_SCREENSHOT_DIR`` when set (``docs/screenshots`` to
refresh the README's pictures), else to the test's temporary folder.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
READY = (
    '[data-testid="stApp"][data-test-script-state="notRunning"]'
    '[data-test-connection-state="CONNECTED"]'
)
DRAWN = ".vega-embed :is(canvas, svg.marks)"

# url path, query, heading, number of charts that must draw
PAGES: list[tuple[str, str, str, int]] = [
    ("", "", "optpipe inspector", 0),
    ("timeline", "schedule={offload2}", "Timeline", 1),
    ("memory", "schedule={offload1}", "Memory", 2),
    ("solver", "run={solver}", "Solver", 1),
    ("compare", "problem={problem2}", "Compare", 2),
    ("profiles", "", "Profiles", 2),
    ("training", "", "Training", 2),
    ("export", "schedule={offload2}", "Export", 0),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api")
    from optpipe_lightning.inspector.demo import fill_database
    from optpipe_lightning.inspector.launch import free_port, spawn_inspector

    url = f"sqlite:///{tmp_path_factory.mktemp('browser') / 'optpipe.db'}"
    # the baselines make the Solver and Compare screenshots richer, at a cost of a few seconds
    info = fill_database(url, baselines=bool(os.environ.get("OPTPIPE_SCREENSHOT_DIR")))
    port = free_port()
    proc = spawn_inspector(url, port)
    try:
        yield f"http://127.0.0.1:{port}", info
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:
            proc.kill()


def wait_ready(page: Any, heading: str) -> None:
    page.wait_for_selector(READY, timeout=30_000)
    page.get_by_role("heading", name=heading).first.wait_for(timeout=30_000)
    page.wait_for_selector(READY, timeout=30_000)  # a rerun may follow the first render


def save_png(png: bytes, path: Path) -> None:
    """The screenshot as a 256-colour PNG (a third of the size; the UI has few colours)."""
    try:
        from PIL import Image
    except ImportError:
        path.write_bytes(png)
        return
    with Image.open(io.BytesIO(png)) as im:
        im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(
            path, optimize=True
        )


def check_tooltip(page: Any) -> None:
    """Hovering a bar of the timeline shows its tooltip (op, stage, microbatch, duration)."""
    box = page.locator(DRAWN).first.bounding_box()
    assert box is not None
    tip = page.locator("#vg-tooltip-element")
    for fx in (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6):
        page.mouse.move(box["x"] + box["width"] * fx, box["y"] + box["height"] * 0.2)
        page.wait_for_timeout(100)
        if tip.count() and tip.is_visible() and "microbatch" in tip.inner_text():
            break
    else:
        pytest.fail("no tooltip over the timeline's bars")
    assert "duration (ms)" in tip.inner_text()
    page.mouse.move(0, 0)


def test_every_page_draws(server: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    base, info = server
    ids = {
        "offload1": info["schedules"][(1, "greedy-offload")],
        "offload2": info["schedules"][(2, "greedy-offload")],
        "solver": info["solver_run"],
        "problem2": info["problems"][1],
    }
    shots = Path(os.environ.get("OPTPIPE_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            for path, query, heading, n_charts in PAGES:
                page.goto(f"{base}/{path}?{query.format(**ids)}")
                wait_ready(page, heading)
                if n_charts:
                    page.wait_for_function(
                        f"document.querySelectorAll('{DRAWN}').length >= {n_charts}",
                        timeout=30_000,
                    )
                    assert page.locator(DRAWN).count() == n_charts, path
                assert page.locator('[data-testid="stException"]').count() == 0, path
                assert page.get_by_text("Page not found").count() == 0, path
                assert (
                    page.locator('[data-testid="stAlert"]').filter(has_text="database").count() == 0
                )
                page.wait_for_timeout(300)  # let the last chart finish its transition
                shot = shots / f"{path or 'overview'}.png"
                save_png(page.screenshot(), shot)
                assert shot.stat().st_size > 10_000
                if path == "timeline":
                    check_tooltip(page)
            # the sidebar lists every page and navigates without a reload
            links = page.locator('[data-testid="stSidebarNav"] a')
            assert links.count() == len(PAGES)
            links.filter(has_text="Memory").first.click()
            wait_ready(page, "Memory")
            page.wait_for_function(
                f"document.querySelectorAll('{DRAWN}').length >= 2", timeout=30_000
            )
            assert not errors, errors
        finally:
            browser.close()
