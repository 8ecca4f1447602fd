"""Which process runs a solver or training run, and whether it still does.

A run records its owner when it starts: ``host|boot id|pid|process start time`` (Linux: the boot
id from ``/proc/sys/kernel/random/boot_id`` and the start time in clock ticks from
``/proc/<pid>/stat``, so a reused pid or a reboot is not mistaken for the owner; elsewhere both
are empty and only the pid is checked). A run still ``running`` whose owner is on this host and
gone (killed, crashed, the machine rebooted) could not finish: it reads ``interrupted`` wherever it
is next seen (``display_status``), and a writer stores that (``mark_interrupted``, called when a
run starts and by ``optpipe db check``). Runs owned by another host are left as they are: only
their own host can tell.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .models import SolverRunRecord, TrainingRunRecord, utcnow

RUNNING = "running"
INTERRUPTED = "interrupted"


@lru_cache(maxsize=1)
def _host() -> str:
    return socket.gethostname()[:100]


@lru_cache(maxsize=1)
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> str | None:
    """The process's start time since boot in clock ticks; '' where /proc is missing, None if
    no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return None if os.path.isdir("/proc/self") else ""
    except OSError:
        return ""
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


def current_owner() -> str:
    """This process, as a run's ``owner``."""
    pid = os.getpid()
    return f"{_host()}|{_boot_id()}|{pid}|{_start_ticks(pid) or ''}"


def owner_alive(owner: str | None) -> bool | None:
    """True or False for an owner on this host; None when this host cannot tell."""
    if not owner:
        return None
    parts = owner.split("|")
    if len(parts) != 4 or parts[0] != _host():
        return None
    _, boot, pid_text, started = parts
    try:
        pid = int(pid_text)
    except ValueError:
        return None
    if boot and _boot_id() and boot != _boot_id():
        return False  # the machine rebooted since
    ticks = _start_ticks(pid)
    if ticks is None:
        return False
    if ticks and started:
        return ticks == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def display_status(status: str, owner: str | None) -> str:
    """``interrupted`` for a run still marked running whose owner is gone; else ``status``."""
    if status == RUNNING and owner_alive(owner) is False:
        return INTERRUPTED
    return status


def mark_interrupted(s: Session) -> int:
    """Store ``interrupted`` on every running run whose owner is gone; how many there were."""
    n = 0
    for model in (SolverRunRecord, TrainingRunRecord):
        rows: Any = s.scalars(select(model).where(model.status == RUNNING))
        for rec in rows:
            if owner_alive(rec.owner) is False:
                rec.status = INTERRUPTED
                rec.finished_at = utcnow()
                n += 1
    if n:
        s.flush()
    return n
