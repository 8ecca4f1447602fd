"""Numbers in messages differ where the values differ; a note is one line on any stderr."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from optpipe_lightning.cli import app
from optpipe_lightning.profiles_db.validation import evaluation_mismatch
from optpipe_lightning.schedule import Problem, evaluate
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.schedule.units import distinct

SMALL = {
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


@pytest.mark.parametrize(
    ("a", "b"),
    [(0.390884, 0.390884 * (1 + 1e-6)), (1.0, 1.0 + 1e-12), (123456789.0, 123456790.0)],
)
def test_distinct_prints_digits_that_differ(a: float, b: float) -> None:
    x, y = distinct(a, b)
    assert x != y
    assert float(x) != float(y)


def test_distinct_keeps_six_digits_when_they_already_differ() -> None:
    assert distinct(0.5, 0.25) == ("0.5", "0.25")
    assert distinct(2.0, 2.0) == ("2.0", "2.0")


def test_a_lie_one_ppm_off_shows_differing_digits() -> None:
    problem = Problem.model_validate(SMALL)
    ev = evaluate(problem, generate("1f1b", problem))
    assert ev.makespan is not None
    lie = ev.model_copy(update={"makespan": ev.makespan * (1 + 1e-6)})
    msg = evaluation_mismatch(lie, ev)
    assert msg is not None
    said, found = msg.split("claims makespan ")[1].split(", but the simulator times it at ")
    assert said != found


def test_a_long_note_stays_on_one_line_when_stderr_is_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import optpipe_lightning.solver as solver_pkg

    real = solver_pkg.solve
    note = "time limit 1 s: skipped " + "; ".join(f"baseline number {i} stopped" for i in range(15))

    def noisy(*args: Any, **kwargs: Any) -> Any:
        return dataclasses.replace(real(*args, **kwargs), message=note)

    monkeypatch.setattr(solver_pkg, "solve", noisy)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(SMALL))
    res = CliRunner().invoke(app, ["solve", str(path), "--time-limit", "5", "--json"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["solve", str(path), "--time-limit", "5"])
    assert res.exit_code == 0, res.output
    lines = [x for x in res.stderr.splitlines() if x]
    assert lines == [f"optpipe: note: {note}"]


def test_a_limit_just_below_what_is_needed_shows_differing_digits() -> None:
    from optpipe_lightning.schedule.baselines import NotApplicable
    from optpipe_lightning.solver.feasibility import check_memory_limit
    from optpipe_lightning.solver.results import InfeasibleMemoryLimit

    # one activation of 1 GB; the limit 100 bytes below it (equal in 6 significant digits)
    act = {"m_f": 1e9, "m_b": -5e8, "m_w": -5e8}
    problem = Problem.model_validate({**SMALL, **act, "memory_limit": 1e9 - 100})
    with pytest.raises(InfeasibleMemoryLimit) as e:
        check_memory_limit(problem)
    said, rest = str(e.value).removeprefix("memory_limit ").split(" on stage 0 ", 1)
    assert said != rest.split("(")[1].split(" bytes")[0], str(e.value)
    with pytest.raises(NotApplicable) as na:
        generate("zb-auto", problem)
    said, rest = str(na.value).removeprefix("memory_limit ").split(" on stage 0 ", 1)
    assert said != rest.split("activation ")[1].split(" ")[0], str(na.value)


def test_a_wrong_kind_of_row_is_one_line_without_pydantic_prefix(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["db", "show", "999", "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "Value error" not in lines[0]
    assert "Invalid value for 'what': '999' is not one of 'problem', 'schedule'" in lines[0]
    assert lines[0].endswith("(see `optpipe db show --help`)")
