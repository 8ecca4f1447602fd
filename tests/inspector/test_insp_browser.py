"""The inspector in a real browser: Debian's headless chromium driven by Playwright.

Starts the app on a database the test fills, opens every page, waits until Streamlit has finished
running the script, and checks that there is no exception box and that every chart drew (a Vega
canvas or SVG). Screenshots go to ``$OPTPIPE_SCREENSHOT_DIR`` when set (``docs/screenshots`` to
refresh the README's pictures), else to the test's temporary folder.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from optpipe_lightning.cli.demo import DemoDatabase

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
    ("timeline", "schedule={solved}", "Timeline", 2),
    ("memory", "schedule={solved}", "Memory", 2),
    ("solver", "run={solver}", "Solver", 1),
    ("compare", "problem={problem}", "Compare", 2),
    ("profiles", "", "Profiles", 2),
    ("training", "", "Training", 4),
    ("export", "schedule={solved}", "Export", 0),
]


@pytest.fixture(scope="module")
def server(
    demo_db: DemoDatabase, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, DemoDatabase]]:
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api")
    from optpipe_lightning.inspector.launch import free_port, spawn_inspector

    # a copy: the test starts a solve in it while the Solver page is open
    path = tmp_path_factory.mktemp("browser") / "optpipe.db"
    with sqlite3.connect(demo_db.url.removeprefix("sqlite:///")) as a, sqlite3.connect(path) as b:
        a.backup(b)
    db = DemoDatabase(f"sqlite:///{path}")
    db.__dict__.update({k: v for k, v in demo_db.__dict__.items() if k != "url"})
    port = free_port()
    proc = spawn_inspector(db.url, port)
    try:
        yield f"http://127.0.0.1:{port}", db
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
    """Hovering a bar of the timeline shows its tooltip (op, stage, microbatch, start, end)."""
    gantt = page.locator(DRAWN).nth(1)  # the Gantt, under the busy strips
    gantt.scroll_into_view_if_needed()
    # an SVG chart (under 2,000 bars) labels each bar with its tooltip's fields
    bar = page.locator('.vega-embed path[aria-label*="microbatch"]').nth(5)
    box = bar.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    tip = page.locator("#vg-tooltip-element")
    tip.wait_for(state="visible", timeout=5_000)
    text = tip.inner_text()
    assert "microbatch" in text and "end (ms)" in text, text
    page.mouse.move(0, 0)


def test_every_page_draws(server: tuple[str, DemoDatabase], tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    base, db = server
    ids = {
        "solved": db.schedules[("gpt-4x8x2", "adaoffload")],  # offloads, whatever the load
        "solver": db.solver_runs[("gpt-4x8", "cpsat")],
        "problem": db.problems["gpt-4x8"],
    }
    shots = Path(os.environ.get("OPTPIPE_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
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
                # no metric cut off with an ellipsis, no scientific notation
                for value in page.locator('[data-testid="stMetricValue"]').all_inner_texts():
                    assert "…" not in value and "e+" not in value, (path, value)
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


def test_a_solve_started_while_the_page_is_open_appears(
    server: tuple[str, DemoDatabase],
) -> None:
    """The Solver page notices a new run without a reload, and follows it on a click."""
    from playwright.sync_api import sync_playwright

    from optpipe_lightning.inspector import data
    from optpipe_lightning.profiles_db import open_database, repository
    from optpipe_lightning.profiles_db.models import SolverEventRecord, SolverRunRecord

    base, db = server
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(f"{base}/solver?run={db.solver_runs[('gpt-4x8', 'cpsat')]}")
            wait_ready(page, "Solver")
            with open_database(db.url) as w, w.session() as s:
                run = repository.start_solver_run(
                    s, db.problems["gpt-4x8x2"], "cpsat", {"time_limit": 60}
                )
                rec = s.get(SolverRunRecord, run)
                rec.started_at = data.now() - timedelta(seconds=5)
                s.add(SolverEventRecord(run_id=run, wall_time=0.4, makespan=0.5, bound=0.3))
            notice = page.get_by_text(f"Solving now: run #{run}")
            notice.wait_for(timeout=30_000)  # the page polls every few seconds
            page.get_by_role("button", name="follow it").click()
            page.wait_for_url(f"**/solver?run={run}", timeout=30_000)
            wait_ready(page, "Solver")
            page.get_by_text("solving for").first.wait_for(timeout=30_000)
            assert page.locator('[data-testid="stException"]').count() == 0
        finally:
            browser.close()


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["x"] < b["x"] + b["width"] - 0.5
        and b["x"] < a["x"] + a["width"] - 0.5
        and a["y"] < b["y"] + b["height"] - 0.5
        and b["y"] < a["y"] + a["height"] - 0.5
    )


def test_issue_38_choices_widths_and_labels(server: tuple[str, DemoDatabase]) -> None:
    """The chosen schedule survives a page switch (in the URL too); the Compare Gantt fits its
    column; the Training page's event labels do not overlap; the Solver page computes nothing."""
    from playwright.sync_api import sync_playwright

    base, db = server
    sid = db.schedules[("gpt-4x8x2", "adaoffload")]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(f"{base}/timeline?schedule={sid}")
            wait_ready(page, "Timeline")
            page.locator('[data-testid="stSidebarNav"] a').filter(has_text="Memory").first.click()
            wait_ready(page, "Memory")
            page.wait_for_url(f"**/memory?schedule={sid}", timeout=30_000)
            box = page.locator('[data-testid="stSelectbox"]').first
            picked = (box.text_content() or "") + " " + box.locator("input").first.input_value()
            assert f"#{sid} " in picked, picked

            page.goto(f"{base}/compare?problem={db.problems['gpt-4x8']}")
            wait_ready(page, "Compare")
            page.wait_for_function(
                f"document.querySelectorAll('{DRAWN}').length >= 2", timeout=30_000
            )
            column = page.locator('[data-testid="stMainBlockContainer"]').bounding_box()
            gantt = page.locator(".vega-embed").nth(1).bounding_box()
            assert column is not None and gantt is not None
            assert gantt["x"] + gantt["width"] <= column["x"] + column["width"] + 1, (
                gantt,
                column,
            )

            page.goto(f"{base}/training")
            wait_ready(page, "Training")
            page.wait_for_function(
                f"document.querySelectorAll('{DRAWN}').length >= 4", timeout=30_000
            )
            labels = page.locator(".vega-embed svg text").filter(
                has_text=re.compile(r"^(→ #|calibrated)")
            )
            boxes = [b for b in (t.bounding_box() for t in labels.all()) if b]
            assert len(boxes) >= 2
            for i, a in enumerate(boxes):
                for b in boxes[i + 1 :]:
                    assert not _overlap(a, b), (a, b)

            page.goto(f"{base}/solver?run={db.solver_runs[('gpt-4x8', 'cpsat')]}")
            wait_ready(page, "Solver")
            assert page.get_by_text("generating the baseline").count() == 0
            assert page.locator('[data-testid="stException"]').count() == 0
        finally:
            browser.close()
