"""Issue 38 in the inspector (AppTest): a choice stays chosen across pages, the Solver page
shows stored baselines only (a notice names the command that stores them), Compare lists the
schedules of every chunking the solver ran, an older database gets the upgrade command."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

import optpipe_lightning.inspector as inspector
from optpipe_lightning.cli.demo import DemoDatabase
from optpipe_lightning.profiles_db import open_database, repository

APP = Path(inspector.__file__).parent / "app.py"
TINY = Path(__file__).resolve().parents[2] / "examples" / "problems" / "tiny-4x8.json"


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    st.cache_data.clear()
    st.cache_resource.clear()
    yield


def app(url: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("OPTPIPE_DB_URL", url)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    return at


def test_the_chosen_schedule_stays_chosen_on_the_next_page(
    demo_db: DemoDatabase, monkeypatch: Any
) -> None:
    at = app(demo_db.url, monkeypatch)
    sid = demo_db.schedules[("gpt-4x8x2", "adaoffload")]
    at.query_params["schedule"] = str(sid)
    at.switch_page("views/timeline.py").run()
    assert at.selectbox(key="schedule").value == sid
    at.query_params.clear()  # what a page switch in the browser does to the query
    at.switch_page("views/memory.py").run()
    assert not at.exception and not at.warning
    assert at.selectbox(key="schedule").value == sid
    assert at.query_params["schedule"] == str(sid)  # and the URL says so again


def test_the_solver_page_never_generates_a_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import optpipe_lightning.schedule.baselines as baselines
    from optpipe_lightning.cli import app as cli

    url = f"sqlite:///{tmp_path / 's.db'}"
    done = CliRunner().invoke(cli, ["solve", str(TINY), "--time-limit", "5", "--db", url])
    assert done.exit_code == 0, done.output

    def boom(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the inspector generated a baseline")

    real_generate, real_chunked = baselines.generate, baselines.generate_chunked
    monkeypatch.setattr(baselines, "generate", boom)
    monkeypatch.setattr(baselines, "generate_chunked", boom)
    at = app(url, monkeypatch)
    at.switch_page("views/solver.py").run()
    assert not at.exception, [e.message for e in at.exception]
    (notice,) = [i.value for i in at.info if "baseline" in i.value]
    assert f"optpipe compare PROBLEM.json --no-solve --db {url}" in notice
    # the limit as the user gave it (the solver got less: the command's own share)
    assert "solved in (limit 5 s)" in {m.label for m in at.metric}
    monkeypatch.setattr(baselines, "generate", real_generate)
    monkeypatch.setattr(baselines, "generate_chunked", real_chunked)
    again = ["compare", str(TINY), "--no-solve", "--time-limit", "30", "--db", url]
    assert CliRunner().invoke(cli, again).exit_code == 0
    monkeypatch.setattr(baselines, "generate", boom)
    st.cache_data.clear()
    at.run()
    at.selectbox(key="solver_run").select(1).run()  # the solve (the comparison is run 2)
    assert not [i for i in at.info if "baseline" in i.value]
    assert any("baselines' makespans" in c.value for c in at.caption)


def test_compare_lists_the_schedules_of_every_chunking(
    demo_db: DemoDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optpipe_lightning.schedule.baselines import generate
    from optpipe_lightning.schedule.chunking import rechunk

    with open_database(demo_db.url, read_only=True) as db, db.session() as s:
        given = repository.get_problem(s, demo_db.problems["gpt-4x8"])
    assert given is not None
    given = given.model_copy(update={"layers_per_stage": 2})
    ran = rechunk(given, 2, "interleaved")
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with open_database(url) as db, db.session() as s:
        sid = repository.store_schedule(
            s, generate("interleaved-1f1b", ran), source="baseline", given=given
        )
    at = app(url, monkeypatch)
    at.query_params["problem"] = given.hash
    at.switch_page("views/compare.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert any(
        o.startswith(f"#{sid} interleaved-1f1b · 2 chunks")
        for o in at.multiselect(key="compare_ids").options
    )
    labels = at.selectbox(key="problem").options
    assert any(o.startswith("v=2 interleaved re-chunking of") for o in labels)


def test_an_older_database_gets_the_upgrade_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alembic import command

    from optpipe_lightning.profiles_db.database import _alembic_config

    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    db = open_database(url)
    with db.engine.begin() as conn:
        command.downgrade(_alembic_config(conn), "0003")
    db.close()
    before = path.read_bytes()
    at = app(url, monkeypatch)
    assert not at.exception
    assert any(f"optpipe db upgrade --db {url}" in e.value for e in at.error)
    assert path.read_bytes() == before
    json.dumps([e.value for e in at.error])  # (plain text)


def test_a_cached_demo_of_an_older_schema_is_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alembic import command

    from optpipe_lightning.cli import demo
    from optpipe_lightning.profiles_db.database import _alembic_config

    cached = tmp_path / "demo.db"
    db = open_database(f"sqlite:///{cached}")
    with db.engine.begin() as conn:
        command.downgrade(_alembic_config(conn), "0003")
    db.close()
    built: list[str] = []

    def build(url: str, **_k: Any) -> None:
        built.append(url)
        open_database(url).close()  # (an empty current database stands for the demo)

    monkeypatch.setattr(demo, "default_demo_path", lambda: cached)
    monkeypatch.setattr(demo, "build_demo_database", build)
    logged: list[str] = []
    assert demo.ensure_demo_database(None, log=logged.append) == f"sqlite:///{cached}"
    assert len(built) == 1 and "older schema" in logged[0]
    open_database(f"sqlite:///{cached}", read_only=True).close()  # current now
    demo.ensure_demo_database(None, log=logged.append)
    assert len(built) == 1  # a current one is reused
