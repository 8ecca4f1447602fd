"""Checks of command-line values that Typer's types let through, and safe output writing.

Typer turns ``--time-limit nan`` into a float and ``--seed 99999999999999999999`` into an int;
these checks refuse them with one line (``UserError``) before any work starts. ``write_output``
turns a failed write (a missing folder, a full disk, no permission) into one line too.
"""

from __future__ import annotations

import math
from pathlib import Path

from .errors import UserError

MAX_SEED = 2**31 - 1


def check_solver_options(backend: str, seed: int, gap: float = 0.0) -> None:
    """``UserError`` for an unknown backend, a seed CP-SAT cannot take, or a gap outside 0..1."""
    from ..solver.solve import BACKENDS

    if backend not in BACKENDS:
        raise UserError(f"--solver {backend!r} is unknown; one of {', '.join(BACKENDS)}")
    if not 0 <= seed <= MAX_SEED:
        raise UserError(f"--seed must be an integer from 0 to {MAX_SEED}, got {seed}")
    if not (math.isfinite(gap) and 0 <= gap <= 1):
        raise UserError(f"--gap must be a relative gap from 0 to 1, got {gap:g}")


def check_out_path(path: Path | None, option: str = "--out") -> None:
    """``UserError`` when ``path`` cannot be a file to write (a folder, a missing folder)."""
    if path is None:
        return
    if path.is_dir():
        raise UserError(f"{option} {path} is a directory; give a file name")
    if not path.parent.is_dir():
        raise UserError(f"{option} {path}: folder {path.parent} does not exist; create it first")


def write_output(path: Path, text: str, option: str = "--out") -> None:
    """Write ``text`` to ``path``; a failure is a ``UserError`` naming the path and why."""
    try:
        path.write_text(text)
    except OSError as e:
        raise UserError(f"{option} {path}: cannot write ({e.strerror or e})") from None
