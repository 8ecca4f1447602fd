"""The first real error of any rank on every rank's console, as one line naming the rank.

When one rank fails, the others are blocked in a receive from it and only learn of it from
gloo's "Connection closed by peer" once its process is gone. So a failing rank first posts its
error in the rendezvous store (the c10d ``TCPStore``; the first post wins), prints it as one
line ``optpipe: rank R failed: Type: message`` and waits (at most ``ACK_SECONDS``) until every
other rank has read it: the store lives in global rank 0's process, which must not end before
the others have read. Every rank watches the key from a thread (``PeerWatch``), so it reads the
post while still blocked; when its own step then fails with the hang-up it prints the same line
and ends with ``SystemExit(1)``: no traceback of a peer's hang-up.

A rank killed without a word (kill -9, the OOM killer) posts nothing: the others find which
rank's process is gone (each rank stores ``host|pid`` at the start) and print
``optpipe: rank R was lost (process P on HOST is gone; killed?)``; when the store itself is
gone, its host (global rank 0) was lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn

log = logging.getLogger(__name__)

ACK_SECONDS = 10.0  # a failing rank waits this long at most for the others to read its error
POLL_SECONDS = 0.25
STORE_TIMEOUT = timedelta(seconds=5)
_HANGUPS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "failed to recv",
    "socket closed",
)


def is_hangup(exc: BaseException) -> bool:
    """Whether ``exc`` is a lost connection to a peer (gloo, the store), not an error here: a
    ``RuntimeError`` (torch's distributed errors derive from it) or ``OSError`` saying so."""
    if not isinstance(exc, RuntimeError | OSError):
        return False
    text = str(exc).lower()
    return any(h in text for h in _HANGUPS)


def one_line(exc: BaseException) -> str:
    """The error on one line: its root cause (torch's pipelining wraps a stage's error in a
    ``RuntimeError`` naming the stage: the user's error is its ``__cause__``)."""
    seen = {id(exc)}
    while exc.__cause__ is not None and id(exc.__cause__) not in seen:
        exc = exc.__cause__
        seen.add(id(exc))
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:297] + "..."


def _default_store() -> Any:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:
        return None


class PeerWatch:
    """One fit's view of the other ranks' errors (every rank holds one)."""

    _fits = 0  # fits in this process: the keys of each fit are its own

    def __init__(self, rank: int, world: int) -> None:
        PeerWatch._fits += 1
        self.rank = rank
        self.world = world
        self.prefix = f"optpipe/fit{PeerWatch._fits}/"
        self.store = _default_store()
        self.seen: str | None = None  # a peer's error line, read by the watcher
        self._done = threading.Event()
        self._acked = False
        if self.store is None or world < 2:
            return
        try:
            self.store.set_timeout(STORE_TIMEOUT)
            self.store.set(f"{self.prefix}pid/{rank}", f"{socket.gethostname()}|{os.getpid()}")
        except Exception as e:  # the watch is a help: never a reason to fail
            log.debug("optpipe: peer watch off: %s", e)
            self.store = None
            return
        threading.Thread(target=self._watch, daemon=True, name="optpipe-peer-watch").start()

    # ---- the watcher ---------------------------------------------------------------------

    def _read(self) -> str | None:
        key = f"{self.prefix}error"
        if not self.store.check([key]):
            return None
        text = self.store.get(key).decode("utf-8", "replace")
        return text or None

    def _watch(self) -> None:
        while not self._done.wait(POLL_SECONDS):
            try:
                text = self._read()
            except Exception:
                return  # the store is gone: its host ended (or the fit did)
            if text is not None and not text.startswith(f"rank {self.rank} "):
                self.seen = text
                self._ack()
                return

    def _ack(self) -> None:
        if self._acked or self.store is None:
            return
        self._acked = True
        try:
            self.store.add(f"{self.prefix}acks", 1)
        except Exception as e:
            log.debug("optpipe: peer watch: %s", e)

    # ---- the end of a fit ------------------------------------------------------------------

    def close(self) -> None:
        self._done.set()

    def on_error(self, exc: BaseException) -> str | None:
        """What this rank says about ``exc`` (one line, printed on stderr here): this rank's own
        error, posted for the others; a peer's error; or a lost peer. Returns the line when the
        error is a peer's (the caller ends the rank), else None."""
        self._done.set()
        if self.store is None:
            return None
        if is_hangup(exc):  # a peer's doing: its posted error, or it was lost
            peer = self.seen or self._posted_by_peer(wait=True)
            line = f"optpipe: {peer if peer is not None else self._lost(exc)}"
            self._ack()
            self._print(f"{line} (rank {self.rank} stops with it)")
            return line
        mine = f"rank {self.rank} failed: {one_line(exc)}"
        try:
            first = self.store.compare_set(f"{self.prefix}error", "", mine).decode()
        except Exception as e:
            log.debug("optpipe: peer watch: %s", e)
            return None
        if first != mine:  # another rank failed first: its error is the run's
            self._ack()
            self._print(f"optpipe: {first}")
            return None
        self._print(f"optpipe: {mine}")
        self._wait_acks()
        return None

    def _posted_by_peer(self, wait: bool) -> str | None:
        """The error a peer posted (waiting a little for it after a hang-up: the peer posts
        before its connections close, but the watcher polls)."""
        end = time.monotonic() + (2 * POLL_SECONDS if wait else 0.0)
        while True:
            try:
                text = self._read()
            except Exception:
                return None
            if text is not None and not text.startswith(f"rank {self.rank} "):
                return text
            if time.monotonic() >= end:
                return None
            time.sleep(POLL_SECONDS / 5)

    def _wait_acks(self) -> None:
        end = time.monotonic() + ACK_SECONDS
        while time.monotonic() < end:
            try:
                if self.store.add(f"{self.prefix}acks", 0) >= self.world - 1:
                    return
            except Exception:
                return
            time.sleep(0.05)

    def _lost(self, exc: BaseException) -> str:
        """Which peer is gone (its process, on this host), or the store's host."""
        host = socket.gethostname()
        try:
            for r in range(self.world):
                if r == self.rank:
                    continue
                where, _, pid = self.store.get(f"{self.prefix}pid/{r}").decode().partition("|")
                if where == host and pid.isdigit() and not _alive(int(pid)):
                    return f"rank {r} was lost (process {pid} on {host} is gone; killed?)"
        except Exception:
            return "rank 0 was lost (the rendezvous store it hosts is gone)"
        return f"a peer rank was lost: {one_line(exc)[:200]}"

    @staticmethod
    def _print(line: str) -> None:
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (ended, not yet reaped by its parent) is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def end_for_peer(scheduler: Any, teardown: Callable[[], None]) -> NoReturn:
    """End this rank after a peer failed: record the run as failed, stop the background
    solver, then ``teardown``; no wait for anything in flight with the peer (its connections
    are gone: nothing more can run). ``SystemExit(1)``: no traceback of the hang-up."""
    if scheduler is not None:
        with contextlib.suppress(Exception):
            if scheduler.resolve.solver is not None:
                scheduler.resolve.solver.stop()
        with contextlib.suppress(Exception):
            scheduler.records.close("failed", gather_peaks=False)
    with contextlib.suppress(Exception):
        teardown()
    raise SystemExit(1)
