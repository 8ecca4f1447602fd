"""A solve in a child process of its own, at low priority: the training's background solver.

``python -m optpipe_lightning.solver.background`` reads one JSON line on stdin::

    {"problem": <problem JSON text>, "backend": "auto", "time_limit": 30.0,
     "workers": 1, "nice": 19, "chunkings": [[1, "interleaved"]]}

(``chunkings``, optional: the (chunk count, placement) pairs to search, ``solve``'s argument),
lowers its own priority by ``nice`` (``os.nice``: the training processes keep the cores they
need; the solve gets what they leave idle), runs ``solve`` with ``workers`` threads, and writes
one JSON line per event on stdout: ``{"kind": "incumbent", "schedule": <schedule JSON text>,
"makespan": s, "bound": s | null, "wall": s}`` for every improved schedule the moment it is
found, ``{"kind": "error", "message": ...}`` if the solve fails, and ``{"kind": "done", "wall":
s}`` at the end. A ``stop`` line on stdin ends the search early. It imports the solver and the
schedule types only (no torch, no Lightning, not the training script), so it starts in about
the time OR-Tools takes to import.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import Any


def _emit(lock: threading.Lock, event: dict[str, Any]) -> None:
    with lock:
        try:
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, OSError, ValueError):  # the training process is gone
            os._exit(0)  # quietly: nobody is left to read a traceback


def _chunkings(value: Any) -> list[tuple[int, str]] | None:
    """The request's ``chunkings`` ([[num_chunks, placement], ...]; absent: the solver's
    default, every chunking the problem's ``layers_per_stage`` allows)."""
    if value is None:
        return None
    return [(int(v), str(pl)) for v, pl in value]


def main() -> None:
    t0 = time.perf_counter()
    request = json.loads(sys.stdin.readline())
    nice = int(request.get("nice", 0))
    if nice > 0 and hasattr(os, "nice"):
        with contextlib.suppress(OSError):  # not allowed here: run at normal priority
            os.nice(nice)
    lock = threading.Lock()
    stop = threading.Event()

    def watch() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        from ..schedule import Problem
        from .results import Incumbent
        from .solve import solve

        problem = Problem.model_validate_json(request["problem"])

        def send(inc: Incumbent) -> None:
            if inc.schedule is not None:
                _emit(
                    lock,
                    {
                        "kind": "incumbent",
                        "schedule": inc.schedule.to_json(),
                        "makespan": inc.makespan,
                        "bound": inc.bound,
                        "wall": time.perf_counter() - t0,
                    },
                )

        solve(
            problem,
            backend=str(request.get("backend", "auto")),
            time_limit=float(request.get("time_limit", 30.0)),
            workers=int(request.get("workers", 1)),
            on_incumbent=send,
            stop=stop,
            chunkings=_chunkings(request.get("chunkings")),
        )
    except Exception as e:  # reported to the parent, never raised into training
        _emit(lock, {"kind": "error", "message": f"{type(e).__name__}: {e}"})
    _emit(lock, {"kind": "done", "wall": time.perf_counter() - t0})


if __name__ == "__main__":
    main()
