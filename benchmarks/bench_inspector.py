"""Time until the inspector's Timeline page of a large schedule has drawn in headless Chromium.

    python benchmarks/bench_inspector.py [--stages 16 --microbatches 64 --chunks 2
                                          --offload-every 2 --repeats 5]

Builds a p x m x v problem with offload, a schedule with copies (the inspector's greedy list
scheduler, every ``offload-every``-th microbatch offloaded), stores it in a fresh SQLite database,
starts the inspector, and opens ``/timeline?schedule=ID`` in Debian's chromium through Playwright
(a new page load each time: connection, script run, Arrow transfer, Vega rendering). "Drawn"
means the Vega canvas exists and has painted pixels. The first load is cold (the server
simulates the schedule); the others hit the server's cache. Also times a mouse-wheel zoom and a
tooltip. Goal: a warm load under 2 s. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from optpipe_lightning.inspector.demo import demo_problem, greedy_schedule
from optpipe_lightning.inspector.launch import free_port, spawn_inspector
from optpipe_lightning.profiles_db import open_database, repository

READY = (
    '[data-testid="stApp"][data-test-script-state="notRunning"]'
    '[data-test-connection-state="CONNECTED"]'
)
PAINTED = """() => {
  const c = document.querySelector('.vega-embed canvas');
  if (!c || !c.width || !c.height) return false;
  const ctx = c.getContext('2d');
  const y = Math.floor(c.height * 0.3);
  const row = ctx.getImageData(0, y, c.width, 1).data;
  let colored = 0;
  for (let i = 0; i < row.length; i += 4) {
    const [r, g, b, a] = [row[i], row[i + 1], row[i + 2], row[i + 3]];
    if (a > 0 && !(r > 240 && g > 240 && b > 240)) colored++;
  }
  return colored > 50;
}"""
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--microbatches", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--offload-every", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print(
            "bench_inspector: Debian's chromium is not installed (apt-get install chromium)",
            file=sys.stderr,
        )
        return 2
    from playwright.sync_api import sync_playwright

    pb = demo_problem(args.stages, args.microbatches, args.chunks)
    sc = greedy_schedule(pb, offload_every=args.offload_every)
    bars = sum(len(r) for r in sc.actions)
    tmp = Path(tempfile.mkdtemp(prefix="optpipe-bench-"))
    url = f"sqlite:///{tmp / 'bench.db'}"
    with open_database(url) as db, db.session() as s:
        sid = repository.store_schedule(s, sc, source="bench")
    port = free_port()
    proc = spawn_inspector(url, port)
    loads: list[float] = []
    scripts: list[float] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            for _ in range(args.repeats + 1):
                t0 = time.perf_counter()
                page.goto(f"http://127.0.0.1:{port}/timeline?schedule={sid}")
                page.get_by_role("heading", name="Timeline").wait_for(timeout=60_000)
                page.wait_for_selector(READY, timeout=60_000)
                t_script = time.perf_counter() - t0
                page.wait_for_function(PAINTED, timeout=60_000, polling=20)
                loads.append(time.perf_counter() - t0)
                scripts.append(t_script)
            canvas = page.locator(".vega-embed canvas").first
            box = canvas.bounding_box()
            assert box is not None
            cx, cy = box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.3
            page.mouse.move(cx, cy)
            t0 = time.perf_counter()
            for _ in range(5):
                page.mouse.wheel(0, -200)
                page.evaluate("() => new Promise(r => requestAnimationFrame(() => r(null)))")
            zoom = time.perf_counter() - t0
            t0 = time.perf_counter()
            tip_ms = None
            for k in range(40):
                page.mouse.move(cx + (k % 8) * 3, cy + (k // 8) * 2)
                tip = page.locator("#vg-tooltip-element.visible")
                if tip.count() and "microbatch" in tip.inner_text():
                    tip_ms = time.perf_counter() - t0
                    break
            browser.close()
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    warm = loads[1:]
    print(
        f"Inspector Timeline page, {args.stages}x{args.microbatches}x{args.chunks} schedule, "
        f"{bars:,} bars ({sc.num_offloaded()} offloaded activations), headless chromium, "
        f"{os.cpu_count()} CPUs:\n"
    )
    print("| measure | seconds |")
    print("|---|---|")
    print(f"| first load (cold server cache: simulate + draw) | {loads[0]:.2f} |")
    print(f"| load until drawn, median of {len(warm)} warm loads | {statistics.median(warm):.2f} |")
    print(f"| load until drawn, worst warm load | {max(warm):.2f} |")
    print(f"| script finished (median warm) | {statistics.median(scripts[1:]):.2f} |")
    print(f"| 5 wheel-zoom steps | {zoom:.2f} |")
    print(f"| tooltip after hover | {'not shown' if tip_ms is None else f'{tip_ms:.2f}'} |")
    goal = statistics.median(warm) < 2.0
    print(f"\ngoal (< 2 s warm): {'met' if goal else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
