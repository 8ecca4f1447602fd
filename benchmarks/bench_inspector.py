"""Time to the first drawn Timeline of a 16x64x2 schedule, cold and warm, this code beside an
older commit's, in headless chromium.

    python benchmarks/bench_inspector.py [--old REF] [--repeats 3] [--warm 4]
                                         [--schedule pipeoffload]

Builds the 16 x 64 x 2 demo problem (a GPT-like stack on 16 GPUs, limit of 6 activations,
offload) and one schedule of it from ``schedule.baselines`` (``--schedule``; pipeoffload has
~8,800 ops with its copies), and stores it in a fresh SQLite database for each app: this
worktree's, and the one of ``--old`` (default: where this branch left main), checked out with
``git worktree add`` into a temporary folder and given a database made by its own code.

Per app and repeat (the apps alternate, so load on the machine hits both alike):

- cold: start the server process, open ``/timeline?schedule=ID`` in a new browser context (no
  cache: the frontend is downloaded as on a first visit) as soon as the server answers; time
  from starting the process, and from the navigation, until the Gantt's canvas has painted bars;
- warm: reload the page ``--warm`` times in that context (server caches and browser cache hot).

Prints a Markdown table: medians per app and the ratio new / old.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY = (
    '[data-testid="stApp"][data-test-script-state="notRunning"]'
    '[data-test-connection-state="CONNECTED"]'
)
# the last Vega canvas on the page (the Gantt) has painted bars in its upper third
PAINTED = """(n) => {
  const all = document.querySelectorAll('.vega-embed canvas');
  if (all.length < n) return false;
  const c = all[all.length - 1];
  if (!c.width || !c.height) return false;
  const ctx = c.getContext('2d');
  for (const f of [0.15, 0.3, 0.45]) {
    const row = ctx.getImageData(0, Math.floor(c.height * f), c.width, 1).data;
    let colored = 0;
    for (let i = 0; i < row.length; i += 4) {
      const [r, g, b, a] = [row[i], row[i + 1], row[i + 2], row[i + 3]];
      if (a > 0 && !(r > 240 && g > 240 && b > 240)) colored++;
    }
    if (colored > 50) return true;
  }
  return false;
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
STORE = """
import sys
from optpipe_lightning.profiles_db import open_database, repository
from optpipe_lightning.schedule import Schedule
sc = Schedule.model_validate_json(open(sys.argv[1]).read())
with open_database(sys.argv[2]) as db, db.session() as s:
    print(repository.store_schedule(s, sc, source="bench"))
"""
FLAGS = [
    "--server.address",
    "127.0.0.1",
    "--browser.gatherUsageStats",
    "false",
    "--server.headless",
    "true",
    "--server.fileWatcherType",
    "none",
    "--client.toolbarMode",
    "viewer",
]


@dataclass
class App:
    name: str
    tree: Path
    command: list[str]  # without port and database arguments
    canvases: int  # Vega canvases on its Timeline page (the Gantt is the last)
    url: str = ""
    sid: int = 0
    cold: list[float] = field(default_factory=list)
    cold_nav: list[float] = field(default_factory=list)
    server: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.tree)}

    def store(self, schedule_path: Path, db_path: Path) -> None:
        self.url = f"sqlite:///{db_path}"
        out = subprocess.run(
            [sys.executable, "-c", STORE, str(schedule_path), self.url],
            cwd=self.tree,
            env=self.env(),
            capture_output=True,
            text=True,
            check=True,
        )
        self.sid = int(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_health(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError("server did not answer")


def run_once(app: App, browser: object, warm: int) -> None:
    port = free_port()
    cmd = [*app.command, "--server.port", str(port), "--", "--db", app.url]
    log = tempfile.TemporaryFile()  # noqa: SIM115
    t0 = time.perf_counter()
    # cwd: ``python -m`` puts the working directory first on sys.path
    proc = subprocess.Popen(cmd, cwd=app.tree, env=app.env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_health(port, proc)
        t_up = time.perf_counter()
        ctx = browser.new_context(viewport={"width": 1440, "height": 900})  # type: ignore[attr-defined]
        page = ctx.new_page()
        target = f"http://127.0.0.1:{port}/timeline?schedule={app.sid}"
        t_nav = time.perf_counter()
        page.goto(target)
        try:
            page.wait_for_function(PAINTED, arg=app.canvases, timeout=120_000, polling=20)
        except Exception:
            shot = Path(tempfile.gettempdir()) / f"bench-inspector-{app.name}.png"
            page.screenshot(path=str(shot))
            print(f"bench_inspector: {app.name} never drew; see {shot}", file=sys.stderr)
            raise
        t_drawn = time.perf_counter()
        app.server.append(t_up - t0)
        app.cold.append(t_drawn - t0)
        app.cold_nav.append(t_drawn - t_nav)
        for _ in range(warm):
            t1 = time.perf_counter()
            page.goto(target)
            page.wait_for_selector(READY, timeout=120_000)
            page.wait_for_function(PAINTED, arg=app.canvases, timeout=120_000, polling=20)
            app.warm.append(time.perf_counter() - t1)
        ctx.close()
    finally:
        proc.terminate()
        proc.wait(15)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default=None, help="git ref of the code to compare with")
    ap.add_argument("--repeats", type=int, default=3, help="cold starts per app")
    ap.add_argument("--warm", type=int, default=4, help="reloads after each cold start")
    ap.add_argument(
        "--schedule",
        default="adaoffload",
        help="baseline that makes the schedule (the published PipeOffload rule fits nothing here)",
    )
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print(
            "bench_inspector: chromium is not installed (apt-get install chromium)", file=sys.stderr
        )
        return 2
    from playwright.sync_api import sync_playwright

    from optpipe_lightning.cli.demo import demo_problem, demo_profile
    from optpipe_lightning.inspector.launch import streamlit_command
    from optpipe_lightning.schedule.baselines import generate

    old_ref = (
        args.old
        or subprocess.run(
            ["git", "merge-base", "HEAD", "main"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    pb = demo_problem(demo_profile(16, 64, 2), 6.0, name="bench 16x64x2")
    sc = generate(args.schedule, pb)
    ops = sum(len(r) for r in sc.actions)
    tmp = Path(tempfile.mkdtemp(prefix="optpipe-bench-insp-"))
    old_tree = tmp / "old"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(old_tree), old_ref],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    try:
        schedule_path = tmp / "schedule.json"
        schedule_path.write_text(sc.to_json())
        old_app = old_tree / "optpipe_lightning" / "inspector" / "app.py"
        new_cmd = streamlit_command(None, None)  # this tree's launcher: serve.py
        apps = [
            App(
                "old", old_tree, [sys.executable, "-m", "streamlit", "run", str(old_app), *FLAGS], 1
            ),
            App("new", ROOT, new_cmd, 2),
        ]
        for app in apps:
            app.store(schedule_path, tmp / f"{app.name}.db")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            for _ in range(args.repeats):
                for app in apps:
                    run_once(app, browser, args.warm)
            browser.close()
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(old_tree)], cwd=ROOT, check=False
        )
        shutil.rmtree(tmp, ignore_errors=True)

    old, new = apps
    load = os.getloadavg()
    print(
        f"Timeline page of a 16x64x2 {args.schedule} schedule ({ops:,} ops, "
        f"{sc.num_offloaded():,} offloaded activations), headless chromium 1440x900, "
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f} at the end; old = {old_ref[:10]}, "
        f"medians of {args.repeats} cold starts and {args.repeats * args.warm} reloads:\n"
    )
    print("| seconds | old | new | new / old |")
    print("|---|---|---|---|")
    for label, attr in (
        ("server start to first drawn Timeline (cold)", "cold"),
        ("navigation to first drawn Timeline (cold)", "cold_nav"),
        ("server process start to answering", "server"),
        ("reload to drawn Timeline (warm)", "warm"),
    ):
        a = statistics.median(getattr(old, attr))
        b = statistics.median(getattr(new, attr))
        print(f"| {label} | {a:.2f} | {b:.2f} | {b / a:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
