"""The command line with chunks as a decision and a memory margin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from optpipe_lightning.cli import app
from optpipe_lightning.schedule import Problem, Schedule
from optpipe_lightning.schedule.margin import (
    apply_memory_margin,
    limit_with_margin,
    parse_memory_margin,
)

runner = CliRunner()

LAYERED = {
    "format": "optpipe.problem/1",
    "num_stages": 4,
    "num_microbatches": 8,
    "t_f": 1.0,
    "t_b": 1.5,
    "t_w": 0.5,
    "m_f": 4.0,
    "m_b": -3.0,
    "m_w": -1.0,
    "memory_limit": 10.0,
    "offload": {"bytes": 4.0, "d2h_bandwidth": 4.0, "h2d_bandwidth": 4.0},
    "layers_per_stage": 4,
}


def write(tmp_path: Path, name: str, data: object) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def one_line_error(args: list[str], needle: str) -> None:
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("optpipe: error: ")
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("command", ["compare", "solve", "simulate"])
@pytest.mark.parametrize(
    "change,needle",
    [
        ({"layers_per_stage": [4, 4, 4]}, "layers_per_stage has 3 entries, expected num_stages=4"),
        ({"layers_per_stage": 6, "num_chunks": 4}, "num_chunks=4 does not divide the 6 layers"),
        ({"layers_per_stage": 0}, "layers_per_stage must be whole numbers >= 1"),
    ],
)
def test_bad_layers_exit_2_with_one_line(
    tmp_path: Path, command: str, change: dict[str, object], needle: str
) -> None:
    path = write(tmp_path, "p.json", {**LAYERED, **change})
    args = [command, str(path)] + ([str(path)] if command == "simulate" else []) + ["--json"]
    one_line_error(args, needle)


@pytest.mark.parametrize("command", ["compare", "solve"])
@pytest.mark.parametrize(
    "margin,needle",
    [
        ("-0.1", "memory margin must be >= 0"),
        ("-2GB", "memory margin must be >= 0"),
        ("five", "neither a fraction in [0, 1)"),
        ("2PB", "neither a fraction in [0, 1)"),
        ("20", "leaves nothing of the memory limit 10 bytes"),
        ("1.5", "not a whole number: a fraction is below 1 (e.g. 0.015 for 1.5%)"),
    ],
)
def test_bad_memory_margin_exit_2_with_one_line(
    tmp_path: Path, command: str, margin: str, needle: str
) -> None:
    path = write(tmp_path, "p.json", LAYERED)
    one_line_error([command, str(path), "--json", f"--memory-margin={margin}"], needle)


def test_margin_parses_fractions_and_bytes() -> None:
    assert parse_memory_margin("0.05") == pytest.approx(0.05)
    assert parse_memory_margin("2GB") == pytest.approx(2e9)
    assert parse_memory_margin("2e9") == pytest.approx(2e9)
    assert parse_memory_margin("512MiB") == pytest.approx(512 * 2**20)
    assert parse_memory_margin(0) == 0
    assert parse_memory_margin("2.5e9") == pytest.approx(2.5e9)
    assert parse_memory_margin("1.5GB") == pytest.approx(1.5e9)
    with pytest.raises(ValueError, match=r"1\.5GB"):
        parse_memory_margin(1.5)
    assert limit_with_margin(80e9, "0.05") == pytest.approx(76e9)
    assert limit_with_margin(80e9, "2GB") == pytest.approx(78e9)
    with pytest.raises(ValueError, match=">= 0"):
        limit_with_margin(80e9, -0.01)
    pb = Problem.model_validate({**LAYERED, "memory_limit": [10.0, 20.0, 30.0, 40.0]})
    assert apply_memory_margin(pb, 0.1).memory_limits() == pytest.approx([9.0, 18.0, 27.0, 36.0])
    assert apply_memory_margin(pb, "2").memory_limits() == pytest.approx([8.0, 18.0, 28.0, 38.0])
    unlimited = pb.with_changes(memory_limit=None)
    assert apply_memory_margin(unlimited, 0.1) is unlimited


def test_compare_with_margin_judges_every_row_against_the_lower_limit(tmp_path: Path) -> None:
    path = write(tmp_path, "p.json", LAYERED)
    res = runner.invoke(
        app, ["compare", str(path), "--json", "--memory-margin", "0.2", "--time-limit", "2"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["problem"]["memory_limit"] == pytest.approx([8.0] * 4)
    for row in doc["schedules"]:
        assert row["memory_limit"] == pytest.approx([8.0] * 4)
        if row["feasible"]:
            assert max(row["peak_memory"]) <= 8.0 + 1e-9


def test_compare_rows_name_their_chunking(tmp_path: Path) -> None:
    path = write(tmp_path, "p.json", LAYERED)
    # every baseline row (a limit no loaded machine reaches: the rows finish in well under 1 s)
    res = runner.invoke(app, ["compare", str(path), "--json", "--no-solve", "--time-limit", "120"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)["schedules"]}
    assert (rows["interleaved-1f1b"]["num_chunks"], rows["interleaved-1f1b"]["placement"]) == (
        4,
        "interleaved",
    )
    assert rows["zbv"]["num_chunks"] == 2 and rows["zbv"]["placement"] == "vshape"
    assert rows["1f1b"]["num_chunks"] == 1
    # with the solver at a short limit: whatever rows finish, optpipe trails none of them
    res = runner.invoke(app, ["compare", str(path), "--json", "--time-limit", "2"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)["schedules"]}
    fastest = min(r["makespan"] for r in rows.values() if r["feasible"])
    assert rows["optpipe"]["makespan"] <= fastest * (1 + 1e-9)
    # the table names them too
    res = runner.invoke(app, ["compare", str(path), "--no-solve"])
    assert res.exit_code == 0 and "v=4 interleaved" in res.stdout


def test_compare_without_layers_still_names_the_chunking(tmp_path: Path) -> None:
    data = {k: v for k, v in LAYERED.items() if k != "layers_per_stage"}
    path = write(tmp_path, "p.json", {**data, "num_chunks": 2, "placement": "vshape"})
    res = runner.invoke(app, ["compare", str(path), "--json", "--no-solve"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["schedules"]
    assert rows and all((r["num_chunks"], r["placement"]) == (2, "vshape") for r in rows)


def test_a_schedule_solved_on_a_rechunking_simulates_against_the_problem(tmp_path: Path) -> None:
    path = write(tmp_path, "p.json", LAYERED)
    out = tmp_path / "s.json"
    res = runner.invoke(
        app, ["solve", str(path), "--time-limit", "2", "--solver", "heuristic", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    sched = Schedule.from_json(out.read_text())
    assert sched.num_chunks is not None and sched.num_chunks > 1  # finer chunks win here
    assert sched.problem is not None and sched.problem.num_chunks == sched.num_chunks
    # with the embedded problem, and without it (rebuilt from the recorded chunking)
    bare = tmp_path / "bare.json"
    bare.write_text(sched.model_copy(update={"problem": None}).to_json())
    for f in (out, bare):
        res = runner.invoke(app, ["simulate", str(path), str(f), "--json"])
        assert res.exit_code == 0, res.output
        ev = json.loads(res.stdout)
        assert ev["feasible"] and ev["makespan"] == pytest.approx(sched.evaluation.makespan)
        res = runner.invoke(
            app, ["trace", str(f), "--problem", str(path), "--out", str(tmp_path / "t.json")]
        )
        assert res.exit_code == 0, res.output
    other = write(tmp_path, "o.json", {**LAYERED, "t_f": 2.0})
    one_line_error(["simulate", str(other), str(bare)], "not a re-chunking of it")
    trace_args = ["trace", str(bare), "--problem", str(other), "--out", str(tmp_path / "t.json")]
    one_line_error(trace_args, "not a re-chunking of it); give the problem file it was made for")


def test_a_rechunked_schedule_goes_through_the_database(tmp_path: Path) -> None:
    """solve --db stores the schedule with the problem it was built for; export and import
    carry that problem, so the imported schedule re-checks against it."""
    path = write(tmp_path, "p.json", LAYERED)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    res = runner.invoke(
        app, ["solve", str(path), "--time-limit", "1", "--solver", "heuristic", "--db", url]
    )
    assert res.exit_code == 0, res.output
    dump = tmp_path / "dump.json"
    res = runner.invoke(app, ["db", "export", str(dump), "--db", url])
    assert res.exit_code == 0, res.output
    url2 = f"sqlite:///{tmp_path / 'b.db'}"
    res = runner.invoke(app, ["db", "import", str(dump), "--db", url2])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["db", "list", "schedules", "--json", "--db", url2])
    rows = json.loads(res.stdout)["schedules"]
    # the solver's schedule, and on a slow machine an incumbent stored on the way (solve --db
    # stores the newest incumbent every second): each re-checks against its own problem
    assert rows and all(r["feasible"] for r in rows)
    res = runner.invoke(app, ["db", "show", "schedule", str(rows[0]["id"]), "--db", url2])
    stored = Schedule.model_validate(json.loads(res.stdout))
    assert stored.problem is not None and stored.problem.hash == stored.problem_hash
    assert stored.num_chunks == stored.problem.num_chunks
    assert stored.problem.layers() == [4, 4, 4, 4]
