"""Smoke test of an INSTALLED optpipe-lightning (a wheel or a floors install in a fresh venv).

Run it with the venv's python from a directory outside the checkout (the scripts that call it,
``scripts/check_wheel.sh`` and ``scripts/check_floors.sh``, do both)::

    VENV/bin/python scripts/smoke_installed.py --examples CHECKOUT/examples [--inspector] [--fit]

Checks, each a subprocess of the installed ``optpipe`` console script: ``--help``, ``--version``
(against ``optpipe_lightning.__version__``), ``compare`` on
a shipped example problem, a database round trip (``solve --db``, ``db export``, ``db import``
into a second database, ``db list``, ``db check``), optionally the inspector's health endpoint
and a 2-process fit (``examples/train_gpt.py``, gloo). Exits 1 with the failing step's output.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent


def step(name: str, cmd: list[str], *, timeout: float = 300.0) -> str:
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - t0
    if r.returncode != 0:
        print(f"smoke: FAIL {name} (exit {r.returncode}, {took:.1f} s): {' '.join(cmd)}")
        print(r.stdout[-4000:])
        print(r.stderr[-4000:])
        sys.exit(1)
    print(f"smoke: ok   {name} ({took:.1f} s)", flush=True)
    return r.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def inspector_health(db_url: str) -> None:
    port = free_port()
    cmd = [str(BIN / "optpipe"), "inspect", "--db", db_url, "--port", str(port)]
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            while time.monotonic() - t0 < 90:
                if proc.poll() is not None:
                    break
                try:
                    url = f"http://127.0.0.1:{port}/_stcore/health"
                    with urllib.request.urlopen(url, timeout=1) as r:
                        if r.read().strip() == b"ok":
                            print(f"smoke: ok   inspector health ({time.monotonic() - t0:.1f} s)")
                            return
                except OSError:
                    time.sleep(0.25)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.seek(0)
        print(f"smoke: FAIL inspector health: {' '.join(cmd)}")
        print(log.read().decode(errors="replace")[-4000:])
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=Path, required=True, help="the checkout's examples/")
    ap.add_argument("--inspector", action="store_true", help="start `optpipe inspect`, GET health")
    ap.add_argument("--fit", action="store_true", help="a 2-process fit of examples/train_gpt.py")
    args = ap.parse_args()
    examples = args.examples.resolve()
    checkout = examples.parent

    import optpipe_lightning

    where = Path(optpipe_lightning.__file__).resolve()
    if checkout in where.parents:
        sys.exit(f"smoke: optpipe_lightning imported from the checkout ({where}), not the install")
    print(f"smoke: optpipe_lightning {optpipe_lightning.__version__} from {where.parent}")

    optpipe = str(BIN / "optpipe")
    problem = str(examples / "problems" / "tiny-4x8.json")
    with tempfile.TemporaryDirectory(prefix="optpipe-smoke-") as tmp:
        os.chdir(tmp)
        step("optpipe --help", [optpipe, "--help"])
        shown = step("optpipe --version", [optpipe, "--version"]).strip()
        if shown != f"optpipe-lightning {optpipe_lightning.__version__}":
            sys.exit(
                f"smoke: --version printed {shown!r}, the package is {optpipe_lightning.__version__}"
            )
        out = step("compare", [optpipe, "compare", problem, "--time-limit", "5", "--json"])
        if not json.loads(out):
            sys.exit("smoke: compare printed an empty document")
        a, b = f"sqlite:///{tmp}/a.db", f"sqlite:///{tmp}/b.db"
        step("solve --db", [optpipe, "solve", problem, "--time-limit", "5", "--db", a])
        step("db export", [optpipe, "db", "export", f"{tmp}/export.json", "--db", a])
        step("db import", [optpipe, "db", "import", f"{tmp}/export.json", "--db", b])
        listed = json.loads(step("db list", [optpipe, "db", "list", "--json", "--db", b]))
        if "tiny" not in json.dumps(listed) and not listed:
            sys.exit(f"smoke: the imported database lists nothing: {listed}")
        step("db check", [optpipe, "db", "check", "--db", b])
        if args.inspector:
            inspector_health(b)
        if args.fit:
            fit = [sys.executable, str(examples / "train_gpt.py"), "--devices", "2", "--steps", "4"]
            fit += ["--layers", "2", "--dim", "32", "--heads", "2", "--seq", "16", "--vocab", "32"]
            fit += ["--batch", "8", "--time-limit", "2", "--val-every", "4"]
            fit += ["--no-progress-bar", "--db", f"sqlite:///{tmp}/fit.db"]
            out = step("2-process fit", fit, timeout=600)
            if "final loss" not in out:
                sys.exit(f"smoke: the fit printed no final loss:\n{out[-2000:]}")
    print("smoke: all passed")


if __name__ == "__main__":
    main()
