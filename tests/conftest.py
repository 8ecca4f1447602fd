"""Fixtures shared by every test folder.

``deterministic_cpsat``: a test that asserts what the solver *reaches* (an optimum proven, a
makespan found) must not depend on how fast the machine runs it. With this fixture every CP-SAT
search stops on its deterministic time (the work it did), never on the wall clock: a search
given ``max_time_in_seconds = T`` gets ``max_deterministic_time = min(T, its own, CAP)`` instead,
one worker, and no wall-clock limit (``@pytest.mark.cpsat_cap(work)`` lowers ``CAP`` for a test
whose solve runs many searches). Such a test also passes ``solve`` a time limit far beyond
what it needs (``UNBOUNDED_SECONDS``), so no phase of ``solve`` (heuristics, baselines, steady
bound, periodic patterns) is cut by the clock either; what each phase does is then the same on
every machine, only slower or faster. Wall-clock behaviour (deadlines kept, stops honoured) is
tested separately, with margins, in ``tests/solver/test_solver_deadline_*.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from solver_budget import DETERMINISTIC_CAP, UNBOUNDED_SECONDS


def _cache_typer_commands() -> None:
    """Build each Typer app's click command once per session: ``typer.testing.CliRunner``
    rebuilds it (type hints, signatures, ~40 ms) on every ``invoke``, and the CLI tests invoke
    about a thousand times."""
    import functools

    import typer.testing

    if not hasattr(typer.testing._get_command, "cache_info"):
        typer.testing._get_command = functools.lru_cache(maxsize=None)(  # type: ignore[assignment]
            typer.testing._get_command
        )


def pytest_configure(config: pytest.Config) -> None:
    _cache_typer_commands()
    config.addinivalue_line(
        "markers",
        "cpsat_cap(work): with deterministic_cpsat, the most deterministic time of one search "
        f"(default {DETERMINISTIC_CAP:g})",
    )


@pytest.fixture
def deterministic_cpsat(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[None]:
    from ortools.sat.python import cp_model

    real = cp_model.CpSolver.solve
    marker = request.node.get_closest_marker("cpsat_cap")
    cap = float(marker.args[0]) if marker is not None else DETERMINISTIC_CAP

    def solve(self: Any, model: Any, callback: Any = None) -> Any:
        prm = self.parameters
        prm.max_deterministic_time = min(prm.max_deterministic_time, prm.max_time_in_seconds, cap)
        prm.max_time_in_seconds = 10 * UNBOUNDED_SECONDS
        prm.num_workers = 1
        return real(self, model, callback)

    monkeypatch.setattr(cp_model.CpSolver, "solve", solve)
    yield


# A test leaves the environment as it found it. Lightning's popen launcher writes LOCAL_RANK,
# NODE_RANK, WORLD_SIZE and MASTER_* into ``os.environ`` of the process that calls ``fit``; left
# in a test worker, they reach every later subprocess a test starts from ``os.environ``, and a
# script given LOCAL_RANK=0 believes its ranks are launched from outside, starts no rank 1 and
# waits for it at the rendezvous for ever (a hang CI saw).


@pytest.fixture(autouse=True)
def _environment_kept() -> Iterator[None]:
    import os

    before = dict(os.environ)
    yield
    for key in (os.environ.keys() | before.keys()) - {"PYTEST_CURRENT_TEST"}:
        if key not in before:
            del os.environ[key]
        elif os.environ.get(key) != before[key]:
            os.environ[key] = before[key]
