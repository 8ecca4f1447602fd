"""The optpipe command: contracts of --json output and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from optpipe_lightning.cli import app
from optpipe_lightning.schedule import Action, Problem, Schedule

runner = CliRunner()

GOOD = {
    "format": "optpipe.problem/1",
    "num_stages": 2,
    "num_microbatches": 3,
    "t_f": 1.0,
    "t_b": 1.0,
    "t_w": 0.5,
    "m_f": 1.0,
    "m_b": -0.5,
    "m_w": -0.5,
    "memory_limit": 2.0,
}


def write(tmp_path: Path, name: str, data: object) -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def hand_schedule(pb: Problem) -> Schedule:
    rows = [
        [
            Action("F", 0),
            Action("F", 1),
            Action("BW", 0),
            Action("F", 2),
            Action("BW", 1),
            Action("BW", 2),
        ],
        [
            Action("F", 0),
            Action("BW", 0),
            Action("F", 1),
            Action("BW", 1),
            Action("F", 2),
            Action("BW", 2),
        ],
    ]
    return Schedule(problem_hash=pb.hash, generator="hand", actions=rows, problem=pb)


BAD_PROBLEMS = {
    "malformed JSON": ("{not json", "not valid JSON"),
    "wrong type": ({**GOOD, "t_f": "fast"}, "t_f"),
    "negative time": ({**GOOD, "t_b": -1.0}, "t_b must be > 0"),
    "deltas not summing to 0": ({**GOOD, "m_w": -0.2}, "sum to 0"),
    "stage list of wrong length": ({**GOOD, "t_f": [1.0, 1.0, 1.0]}, "expected num_stages=2"),
    "unknown field": ({**GOOD, "t_forward": 1.0}, "t_forward: unknown field"),
    "missing field": ({k: v for k, v in GOOD.items() if k != "t_b"}, "t_b: required"),
    "wrong format": ({**GOOD, "format": "optpipe.schedule/1"}, "expected 'optpipe.problem/1'"),
}


@pytest.mark.parametrize("case", sorted(BAD_PROBLEMS))
@pytest.mark.parametrize("command", ["compare", "solve"])
def test_bad_problem_is_one_line_and_exit_2(tmp_path: Path, case: str, command: str) -> None:
    data, needle = BAD_PROBLEMS[case]
    path = write(tmp_path, "p.json", data)
    res = runner.invoke(app, [command, str(path), "--json"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert needle in lines[0]
    assert lines[0].startswith("optpipe: error: ")
    assert "Traceback" not in res.output


def test_missing_file(tmp_path: Path) -> None:
    res = runner.invoke(app, ["compare", str(tmp_path / "nope.json")])
    assert res.exit_code == 2 and "no such file" in res.stderr


def test_simulate_refuses_a_schedule_of_another_problem(tmp_path: Path) -> None:
    pb = Problem.model_validate(GOOD)
    other = pb.with_changes(t_f=2.0)
    sched = write(tmp_path, "s.json", hand_schedule(other).to_json())
    prob = write(tmp_path, "p.json", GOOD)
    res = runner.invoke(app, ["simulate", str(prob), str(sched), "--json"])
    assert res.exit_code == 2
    assert "made for problem" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_simulate_json_evaluates(tmp_path: Path) -> None:
    pb = Problem.model_validate(GOOD)
    sched = write(tmp_path, "s.json", hand_schedule(pb).to_json())
    prob = write(tmp_path, "p.json", GOOD)
    res = runner.invoke(app, ["simulate", str(prob), str(sched), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["feasible"] is True
    assert doc["makespan"] == pytest.approx(3 * 2.5 + 2.5)
    assert doc["peak_memory"] == [2.0, 1.0]


def test_simulate_infeasible_schedule_exits_1_with_violations(tmp_path: Path) -> None:
    pb = Problem.model_validate({**GOOD, "memory_limit": 1.0})
    sched = write(tmp_path, "s.json", hand_schedule(pb).to_json())
    prob = write(tmp_path, "p.json", {**GOOD, "memory_limit": 1.0})
    res = runner.invoke(app, ["simulate", str(prob), str(sched), "--json"])
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["feasible"] is False and doc["violations"][0]["kind"] == "memory"


def test_console_script_prints_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "p.json", {**GOOD, "num_stages": "two"})
    proc = subprocess.run(
        [sys.executable, "-m", "optpipe_lightning.cli", "compare", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "num_stages" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_problem_from_model_description_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    res = runner.invoke(
        app,
        [
            "problem",
            "--layers",
            "22",
            "--hidden",
            "2304",
            "--heads",
            "24",
            "--seq-len",
            "1024",
            "--microbatch-size",
            "6",
            "--device",
            "a100",
            "--stages",
            "8",
            "--microbatches",
            "24",
            "--memory-limit-microbatches",
            "16",
            "--offload",
            "--attention",
            "eager",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    pb = Problem.model_validate_json(out.read_text())
    assert pb.num_stages == 8 and pb.offload is not None
    assert pb.memory_limits()[0] == pytest.approx(16 * pb.activation_unit())
    tf, tb, tw = pb.cost("t_f"), pb.cost("t_b"), pb.cost("t_w")
    assert (abs(tb + tw - 2 * tf) < 1e-12).all()  # the ZB FLOP model: T_B + T_W = 2 T_F


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--hidden", "64"], "missing --layers"),
        (
            ["--layers", "4", "--hidden", "8", "--heads", "1", "--seq-len", "8", "--stages", "8"],
            "fewer than",
        ),
        (
            [
                "--layers",
                "8",
                "--hidden",
                "8",
                "--heads",
                "1",
                "--seq-len",
                "8",
                "--memory-limit",
                "lots",
            ],
            "expected bytes",
        ),
        (
            ["--layers", "8", "--hidden", "8", "--heads", "1", "--seq-len", "8", "--device", "tpu"],
            "device",
        ),
    ],
)
def test_problem_bad_input(args: list[str], needle: str) -> None:
    res = runner.invoke(app, ["problem", *args])
    assert res.exit_code == 2
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_baseline_export_then_simulate_and_trace(tmp_path: Path) -> None:
    prob = write(tmp_path, "p.json", {**GOOD, "memory_limit": None})
    sched = tmp_path / "s.json"
    res = runner.invoke(app, ["baseline", "1f1b", str(prob), "--out", str(sched)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["simulate", str(prob), str(sched), "--json"])
    assert res.exit_code == 0
    assert json.loads(res.stdout)["makespan"] == pytest.approx((3 + 2 - 1) * 2.5)
    trace = tmp_path / "t.json"
    res = runner.invoke(app, ["trace", str(sched), "--out", str(trace)])
    assert res.exit_code == 0, res.output
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(1 for e in events if e["ph"] == "X") == 2 * 3 * 2  # F and BW per (stage, mb)


def test_baseline_unknown_name_and_not_applicable(tmp_path: Path) -> None:
    prob = write(tmp_path, "p.json", GOOD)
    res = runner.invoke(app, ["baseline", "2f2b", str(prob)])
    assert res.exit_code == 2 and "unknown baseline" in res.stderr
    res = runner.invoke(app, ["baseline", "zbv", str(prob)])
    assert res.exit_code == 2 and "num_chunks=2" in res.stderr


def test_user_errors_of_lazily_imported_parts_are_one_line_including_subclasses(
    tmp_path: Path,
) -> None:
    import typer

    from optpipe_lightning.cli import user_errors
    from optpipe_lightning.profiles_db import NotFoundError, open_database
    from optpipe_lightning.profiles_db import repository as repo

    db = open_database(f"sqlite:///{tmp_path / 'p.db'}")
    with pytest.raises(typer.Exit) as exit_info, user_errors(), db.session() as s:
        repo.get_profile(s, 7)  # NotFoundError, a subclass of DatabaseError
    assert exit_info.value.exit_code == 2
    with pytest.raises(KeyError), user_errors():  # a bug is not dressed up as a user error
        raise KeyError("bug")
    assert issubclass(NotFoundError, LookupError)
