"""Child process for the HiGHS backend (see ``milp_solvers._solve_highs_isolated``).

Reads one base64 pickle ``(model, start, ends_at, gap, seed, workers)`` line on stdin (``ends_at``:
when the search must end, on ``time.monotonic()``),
writes base64 pickles ``("solution", starts, ends, obj, bound)`` and finally ``("done", outcome)``
on stdout; a ``stop`` line on stdin interrupts the search. Never imports OR-Tools.
"""

from __future__ import annotations

import base64
import os
import pickle
import sys
import threading
import time

from .milp import MilpOutcome
from .milp_solvers import HIGHS_MEMORY_BYTES, _solve_highs
from .ticks import OpKey


def cap_memory(limit: int) -> bool:
    """Cap this process's address space at ``limit`` bytes (where the platform can); whether it
    did. An allocation past it fails inside HiGHS and is reported, never the machine's memory."""
    try:
        import resource
    except ImportError:  # not on this platform
        return False
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return True


def main() -> None:
    # the protocol gets a private copy of stdout; fd 1 itself goes to /dev/null, so whatever
    # HiGHS's C++ code prints there (its log, whatever the options say) cannot corrupt it
    proto = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    payload = pickle.loads(base64.b64decode(sys.stdin.buffer.readline()))
    lm, start, ends_at, gap, seed, workers = payload
    cap_memory(HIGHS_MEMORY_BYTES)
    time_limit = ends_at - time.monotonic()  # what is left after this process started
    stop = threading.Event()
    lock = threading.Lock()

    def watch() -> None:
        for line in sys.stdin.buffer:
            if line.strip() == b"stop":
                break
        stop.set()

    threading.Thread(target=watch, daemon=True).start()

    def send(msg: tuple[object, ...]) -> None:
        with lock:
            proto.write(base64.b64encode(pickle.dumps(msg)) + b"\n")
            proto.flush()

    def sol(st: dict[OpKey, int], en: dict[OpKey, int], obj: int, bnd: int) -> None:
        send(("solution", st, en, obj, bnd))

    try:
        out = _solve_highs(lm, start, time_limit, gap, seed, workers, sol, stop)
    except Exception as e:  # reported to the parent, which keeps its incumbent
        out = MilpOutcome("unknown", None, None, message=f"HiGHS failed: {e}")
    send(("done", out))


if __name__ == "__main__":
    main()
