"""Stored profiles cannot shadow reality (issue 33.3): a profile dated in the future is never
used, one of another host never preferred over this host's, and ``db import`` refuses a future
date."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from db_builders import hardware, make_profile
from typer.testing import CliRunner

from optpipe_lightning.cli.db_commands import app
from optpipe_lightning.profiles_db import open_database
from optpipe_lightning.profiles_db import repository as repo
from optpipe_lightning.profiles_db.transfer import ExportDocument


def _ago(days: float) -> str:
    return (datetime.now(UTC) - timedelta(days=days)).isoformat()


def test_this_hosts_profile_wins_over_a_newer_one_of_another_host(sqlite_url: str) -> None:
    here, there = hardware(hostname="node-a"), hardware(hostname="node-b")
    assert here.key == there.key  # an identical machine: the same fingerprint key
    db = open_database(sqlite_url)
    with db.session() as s:
        repo.store_profile(s, make_profile(here, t_f=0.01, measured_at=_ago(2)))
        repo.store_profile(s, make_profile(there, t_f=0.0001, measured_at=_ago(0.001)))
    with db.session() as s:
        found = repo.find_profile(s, here, make_profile().model)
        other = repo.find_profile(s, there, make_profile().model)
        elsewhere = repo.find_profile(s, hardware(hostname="node-c"), make_profile().model)
    assert found is not None and found.stages[0].f.mean == 0.01
    assert other is not None and other.stages[0].f.mean == 0.0001
    assert elsewhere is not None and elsewhere.stages[0].f.mean == 0.0001  # the newest


def test_a_profile_dated_in_the_future_is_never_used(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    db = open_database(sqlite_url)
    with db.session() as s:
        repo.store_profile(s, make_profile(t_f=0.01, measured_at=_ago(1)))
        with pytest.raises(ValueError, match="in the future"):
            repo.store_profile(s, make_profile(t_f=0.0001, measured_at="2099-01-01T00:00:00"))
        fresh = repo.store_profile(s, make_profile(t_f=0.0001, measured_at=_ago(0)))
    # a date that was plausible when stored (the other machine's clock) but is ahead of ours
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as c:
        c.execute("UPDATE profiles SET measured_at = '2099-01-01 00:00:00' WHERE id = ?", (fresh,))
    with db.session() as s:
        found = repo.find_profile(s, hardware(), make_profile().model)
    assert found is not None and found.stages[0].f.mean == 0.01
    assert f"skipping stored profile {fresh}: dated 2099-01-01" in caplog.text


def test_db_import_refuses_a_future_date(sqlite_url: str, tmp_path: Path) -> None:
    doc = ExportDocument(profiles=[make_profile(measured_at="2099-01-01T00:00:00+00:00")])
    path = tmp_path / "future.json"
    path.write_text(doc.model_dump_json())
    res = CliRunner().invoke(app, ["import", str(path), "--db", sqlite_url])
    assert res.exit_code == 2, res.output
    assert "profiles.0" in res.stderr and "in the future" in res.stderr
    assert res.stderr.count("\n") == 1
    ok = json.loads(path.read_text())
    ok["profiles"][0]["measured_at"] = _ago(1)
    path.write_text(json.dumps(ok))
    res = CliRunner().invoke(app, ["import", str(path), "--db", sqlite_url])
    assert res.exit_code == 0, res.output
