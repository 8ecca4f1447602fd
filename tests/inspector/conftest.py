"""Shared data for the inspector tests: the demo database (built once per session by the real
baselines and solver) and a schedule with offloads from a real baseline."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from optpipe_lightning.cli.demo import DemoDatabase, build_demo_database, demo_problem, demo_profile
from optpipe_lightning.schedule import Problem, Schedule, SimResult, simulate
from optpipe_lightning.schedule.baselines import generate


@pytest.fixture(scope="session")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> DemoDatabase:
    """The demo database (solves of 1 s, one worker). Read it only: ``writable_copy`` for
    tests that write."""
    path = tmp_path_factory.mktemp("demo") / "optpipe.db"
    return build_demo_database(f"sqlite:///{path}", time_limit=1.0, workers=1)


@pytest.fixture
def writable_copy(demo_db: DemoDatabase, tmp_path: Path) -> DemoDatabase:
    """A private copy of the demo database (same ids) that a test may write to."""
    src = Path(demo_db.url.removeprefix("sqlite:///"))
    dst = tmp_path / "copy.db"
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    copy = DemoDatabase(f"sqlite:///{dst}")
    copy.__dict__.update({k: v for k, v in demo_db.__dict__.items() if k != "url"})
    return copy


@pytest.fixture(scope="session")
def offload_case() -> tuple[Problem, Schedule, SimResult]:
    """4 stages x 6 microbatches x 2 chunks under a tight limit: adaoffload offloads."""
    pb = demo_problem(demo_profile(4, 6, 2), 2.0, name="test").with_changes(placement="interleaved")
    sc = generate("adaoffload", pb)
    assert sc.evaluation is not None and sc.evaluation.num_offloaded > 0
    return pb, sc, simulate(pb, sc)
