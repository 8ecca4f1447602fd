"""The training's database calls in a child process of their own: no database fault reaches
the training process.

A SQLite file in WAL mode is shared through a memory-mapped ``-shm`` file: when that file is
truncated under a writer, the writer dies of SIGBUS (no exception: the process ends). So the
strategy never opens the database itself: ``DatabaseWriter`` starts
``python -m optpipe_lightning.profiles_db.writer URL`` (it imports SQLAlchemy and the schedule
types only, never torch or the training script) and sends it calls; whatever happens to the
database (unwritable, deleted, locked, full, a damaged ``-shm``), the training process gets an
error it can handle: ``WriterError``.

Protocol (parent and child are the same installation): length-prefixed pickles. A request is a
list of ``(function name, args, kwargs)`` of ``profiles_db.repository``, run in one session (one
transaction); the reply is ``("ok", result of the last call, log lines)`` or ``("error", message,
log lines)``. The first reply is ``("ready", where, [])`` once the database is open. Before each
request the child checks that a SQLite file is still the one it opened (deleted or replaced:
an error, not a silent write into an unlinked file).
"""

from __future__ import annotations

import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import Any, BinaryIO

_HEADER = struct.Struct(">I")
# seconds a call may take beyond SQLite's busy timeout before the child is given up as hung
_MARGIN_SECONDS = 30.0


class WriterError(Exception):
    """The call did not reach the database (the message says why, on one line)."""


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _recv(stream: BinaryIO) -> Any:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError
    (n,) = _HEADER.unpack(head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)  # (our own parent or child, on a private pipe)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:500]


# ---- the child ---------------------------------------------------------------------------------


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(_one_line(record.getMessage()))

    def take(self) -> list[str]:
        out, self.lines = self.lines, []
        return out


def _sqlite_path(db: Any) -> str | None:
    if db.backend != "sqlite":
        return None
    path = db.engine.url.database
    return None if not path or path == ":memory:" else str(path)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def main() -> None:
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write on the reply pipe
    lines = _Lines()
    logging.getLogger("optpipe_lightning").addHandler(lines)
    url = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else None
    try:
        from . import repository as repo
        from .database import BUSY_TIMEOUT_SECONDS, open_database

        busy = float(sys.argv[2]) if len(sys.argv) > 2 else BUSY_TIMEOUT_SECONDS
        db = open_database(url, busy_timeout=busy)
    except Exception as e:
        _send(out, ("error", _one_line(f"{e}"), lines.take()))
        return
    path = _sqlite_path(db)
    opened = None if path is None else _identity(path)
    _send(out, ("ready", db.where, lines.take()))
    while True:
        try:
            request = _recv(inp)
        except EOFError:
            break
        if request is None:
            break
        try:
            if path is not None and _identity(path) != opened:
                raise WriterError(f"the database file {path} was deleted or replaced")
            result = None
            with db.session() as s:
                for name, args, kwargs in request:
                    result = getattr(repo, name)(s, *args, **kwargs)
            reply: tuple[Any, ...] = ("ok", result, lines.take())
        except Exception as e:
            reply = ("error", _one_line(f"{type(e).__name__}: {e}"), lines.take())
        try:
            _send(out, reply)
        except (BrokenPipeError, OSError):
            break
    db.close()


# ---- the parent --------------------------------------------------------------------------------


class DatabaseWriter:
    """A child process that makes the database calls (see the module doc); raises
    ``WriterError`` from ``call`` when the call did not happen, whatever the reason."""

    def __init__(
        self, url: str | None, *, busy_timeout: float | None = None, timeout: float | None = None
    ) -> None:
        """``busy_timeout``: how long a call waits for a locked SQLite file (default
        ``BUSY_TIMEOUT_SECONDS``); ``timeout``: how long any call may take before the process
        is given up as hung (default: the busy timeout and a margin)."""
        from .database import BUSY_TIMEOUT_SECONDS

        busy = BUSY_TIMEOUT_SECONDS if busy_timeout is None else busy_timeout
        self.timeout = busy + _MARGIN_SECONDS if timeout is None else timeout
        self.where = url or "the default database"
        self.dead: str | None = None  # why the child can no longer be used
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "optpipe_lightning.profiles_db.writer", url or "-", str(busy)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # its warnings come back in the replies
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
        kind, where, logs = self._reply()
        self._relog(logs)
        if kind != "ready":
            self.close()
            raise WriterError(where)
        self.where = where

    def _reply(self) -> tuple[str, Any, list[str]]:
        assert self.proc.stdout is not None
        box: list[Any] = []

        def read() -> None:
            try:
                box.append(_recv(self.proc.stdout))  # type: ignore[arg-type]
            except Exception as e:
                box.append(e)

        t = threading.Thread(target=read, daemon=True, name="optpipe-db-reply")
        t.start()
        t.join(self.timeout)
        if not box:
            self._kill(f"the database did not answer within {self.timeout:g} s")
        got = box[0]
        if isinstance(got, Exception):
            self._kill(self._death())
        return got

    def _death(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "the database process stopped answering"
        if code < 0:
            import signal

            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"the database process was killed by {name}"
        return f"the database process exited with code {code}"

    def _kill(self, why: str) -> None:
        self.dead = why
        if self.proc.poll() is None:
            self.proc.kill()
        raise WriterError(why)

    @staticmethod
    def _relog(lines: list[str]) -> None:
        for line in lines:
            logging.getLogger("optpipe_lightning.profiles_db").warning("%s", line)

    def call(self, *ops: tuple[str, tuple[Any, ...], dict[str, Any]]) -> Any:
        """Run ``ops`` (repository function name, args, kwargs) in one transaction; the last
        one's result."""
        with self._lock:
            if self.dead is not None:
                raise WriterError(self.dead)
            assert self.proc.stdin is not None
            try:
                _send(self.proc.stdin, list(ops))  # type: ignore[arg-type]
            except (BrokenPipeError, OSError):
                self._kill(self._death())
            kind, value, logs = self._reply()
            self._relog(logs)
            if kind != "ok":
                raise WriterError(str(value))
            return value

    def close(self) -> None:
        with self._lock:
            if self.proc.poll() is None:
                try:
                    assert self.proc.stdin is not None
                    _send(self.proc.stdin, None)  # type: ignore[arg-type]
                    self.proc.stdin.close()
                    self.proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    self.proc.kill()
            if self.dead is None:
                self.dead = "closed"


if __name__ == "__main__":
    main()
