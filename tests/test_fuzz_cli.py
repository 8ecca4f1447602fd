"""Fuzzing every command in-process with a seeded mutator over the shipped examples.

The mutator damages the bytes (cut, flipped, UTF-16/32, a bad byte, NUL, nesting 10^5 deep),
the types (``"1.5"``, ``true``, ``null``, ``["F"]``), the numbers (NaN, Infinity, 1e400, 1e308,
1e-300, 2**64, 5000-digit integers), the sizes (10^9 stages, 10^6 microbatches, 1000 chunks,
64x4096x2) and the schedules (actions cut, duplicated, reordered, stages dropped or swapped,
claims forged, a file larger than any schedule of its problem). Every case runs through
``compare``, ``solve``, ``baseline``, ``simulate``, ``trace`` and ``db import``, and bad
arguments through every command. What must hold, always:

- never a traceback, never an internal error: exit 0, 1 (``simulate`` of an infeasible
  schedule) or 2, and an exit 2 prints exactly one line ``optpipe: error: ...``;
- never exit 0 on invalid input: a case built invalid exits 2 (and the pydantic model refuses
  it too, so the label is checked), and any exit 0 is cross-checked against the model;
- a damaged schedule is never reported feasible (exit 1 or 2 from ``simulate``).

The default part runs a few hundred cases (seeded, so a failure reproduces); the ``slow`` part
adds ``solve`` and ``compare`` with the solver on every problem case, with another seed.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from optpipe_lightning.cli import app
from optpipe_lightning.schedule import Problem, Schedule
from optpipe_lightning.schedule.baselines import generate

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "problems"
TINY = json.loads((EXAMPLES / "tiny-4x8.json").read_text())
PAPER = json.loads((EXAMPLES / "zb-1.5b-p8-m24.json").read_text())

INVALID, ANY, DAMAGED, TOO_LARGE = "invalid", "any", "damaged", "too large"

runner = CliRunner()


@dataclass
class Case:
    name: str
    data: bytes
    expect: str  # INVALID: exit 2; TOO_LARGE: exit 2 (valid format); DAMAGED: never fits; ANY


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode()


# ---- problem mutations -----------------------------------------------------------------------

NUMBER_FIELDS = ("t_f", "t_b", "t_w", "t_comm", "m_f", "memory_limit")
TIMES = ("t_f", "t_b", "t_w", "t_comm")


def _set(doc: dict[str, Any], field: str, raw: str) -> bytes:
    """The document with ``field``'s value replaced by raw JSON text (NaN, 1e400, ...)."""
    marker = "__FUZZ_MARKER__"
    out = dict(doc)
    out[field] = marker
    return json.dumps(out).replace(f'"{marker}"', raw).encode()


def _byte_cases(rng: random.Random, base: bytes, label: str) -> list[Case]:
    text = base.decode()
    name_at = base.index(b'"name"') + 9 if b'"name"' in base else 5
    cut = rng.randrange(1, len(base) - 2)
    flip = bytearray(base)
    flip[rng.randrange(len(flip))] ^= 1 << rng.randrange(8)
    return [
        Case(f"{label}: cut at {cut}", base[:cut], INVALID),
        Case(f"{label}: a flipped bit", bytes(flip), ANY),
        Case(f"{label}: UTF-16", text.encode("utf-16"), INVALID),
        Case(f"{label}: UTF-16 without BOM", text.encode("utf-16-le"), INVALID),
        Case(f"{label}: UTF-32", text.encode("utf-32"), INVALID),
        Case(f"{label}: UTF-8 BOM", b"\xef\xbb\xbf" + base, ANY),
        Case(f"{label}: a 0xff byte", base[:name_at] + b"\xff" + base[name_at:], INVALID),
        Case(f"{label}: a NUL", base[:name_at] + b"\x00" + base[name_at:], INVALID),
        Case(f"{label}: empty", b"", INVALID),
        Case(f"{label}: random bytes", rng.randbytes(rng.randrange(1, 400)), INVALID),
        Case(f"{label}: a list", b"[" + base + b"]", INVALID),
    ]


def problem_cases(rng: random.Random, doc: dict[str, Any], label: str) -> list[Case]:
    base = _dumps(doc)
    cases = _byte_cases(rng, base, label)
    for depth in (40, 1000, 100_000):
        field = rng.choice(NUMBER_FIELDS)
        cases.append(Case(f"{label}: {field} nested {depth}", _set(doc, field, "[" * depth + "]" * depth), INVALID))  # fmt: skip
    bad_values = {
        '"1.5"': INVALID, "true": INVALID, "false": INVALID, '["F"]': INVALID, "{}": INVALID,
        "[]": INVALID, "NaN": INVALID, "Infinity": INVALID, "-Infinity": INVALID,
        "1e400": INVALID, "1e308": INVALID, "1e16": INVALID, "1e-300": INVALID,
        str(2**64): INVALID, "9" * 5000: INVALID,
    }  # fmt: skip
    for raw, expect in bad_values.items():
        for field in rng.sample(NUMBER_FIELDS, 2):
            cases.append(Case(f"{label}: {field} = {raw[:20]}", _set(doc, field, raw), expect))
    for field in TIMES:
        cases.append(Case(f"{label}: {field} = -1", _set(doc, field, "-1"), INVALID))
        x = rng.choice([0.0, 1e-9, 1e-6, 0.5, 3.0, 1e3, 1e6])
        expect = INVALID if x == 0.0 and field in ("t_f", "t_b") else ANY
        cases.append(Case(f"{label}: {field} = {x:g}", _set(doc, field, repr(x)), expect))
    for field, raw in (
        ("num_stages", "1000000000"), ("num_stages", '"4"'), ("num_stages", "4.0"),
        ("num_stages", "true"), ("num_stages", "0"), ("num_microbatches", "1000000"),
        ("num_microbatches", str(2**64)), ("num_chunks", "1000"), ("num_chunks", "-2"),
        ("placement", '"diagonal"'), ("format", '"optpipe.problem/2"'), ("format", "7"),
        ("offload", '{"bytes": 1.0}'), ("offload", '{"bytes": 1, "d2h_bandwidth": 0, "h2d_bandwidth": 1}'),
        ("memory_limit", "[1, 2]"), ("memory_limit", "0"), ("t_f", "[1, 2, 3]"),
        ("t_forward", "1.0"), ("name", "7"), ("name", json.dumps("x" * 3000)),
    ):  # fmt: skip
        cases.append(Case(f"{label}: {field} = {raw[:30]}", _set(doc, field, raw), INVALID))
    missing = dict(doc)
    del missing[rng.choice(["t_f", "t_b", "t_w", "num_stages", "num_microbatches"])]
    cases.append(Case(f"{label}: a required field missing", _dumps(missing), INVALID))
    huge = {**doc, "num_stages": 64, "num_microbatches": 4096, "num_chunks": 2, "name": "huge"}
    huge["offload"] = (
        None if doc.get("offload") is None else {**doc["offload"], "channel_groups": []}
    )
    for key in (*TIMES, "m_f", "m_b", "m_w"):
        if isinstance(huge.get(key), list):
            huge[key] = huge[key][0] if not isinstance(huge[key][0], list) else huge[key][0][0]
    if huge["offload"] is not None and isinstance(huge["offload"]["bytes"], list):
        huge["offload"]["bytes"] = doc["m_f"] if not isinstance(doc["m_f"], list) else None
    if huge["offload"] is not None and huge["offload"]["bytes"] is None:
        huge["offload"] = None
    cases.append(Case(f"{label}: 64x4096x2", _dumps(huge), TOO_LARGE))
    return cases


def _is_valid_problem(data: bytes) -> bool:
    """The model's own verdict (a UTF-8 byte-order mark is accepted: input_files drops it)."""
    try:
        Problem.model_validate_json(data.removeprefix(b"\xef\xbb\xbf"))
    except (ValidationError, ValueError):
        return False
    return True


# ---- schedule mutations ----------------------------------------------------------------------


def schedule_cases(rng: random.Random, sched: Schedule, label: str) -> list[Case]:
    doc = json.loads(sched.to_json())
    base = _dumps(doc)
    cases = _byte_cases(rng, base, label)

    def mutated(name: str, fn: Callable[[dict[str, Any]], None], expect: str) -> None:
        d = copy.deepcopy(doc)
        fn(d)
        cases.append(Case(f"{label}: {name}", _dumps(d), expect))

    rows = doc["actions"]
    s = rng.randrange(len(rows))
    i = rng.randrange(len(rows[s]))

    def cut(d: dict[str, Any]) -> None:
        del d["actions"][s][i]

    def duplicate(d: dict[str, Any]) -> None:
        d["actions"][s].insert(rng.randrange(len(d["actions"][s])), d["actions"][s][i])

    def reorder(d: dict[str, Any]) -> None:
        rng.shuffle(d["actions"][s])

    def reverse(d: dict[str, Any]) -> None:
        d["actions"][s].reverse()

    def drop_stage(d: dict[str, Any]) -> None:
        del d["actions"][s]

    def extra_stage(d: dict[str, Any]) -> None:
        d["actions"].append(d["actions"][s])

    def swap(d: dict[str, Any]) -> None:
        t = (s + 1) % len(rows)
        d["actions"][s], d["actions"][t] = d["actions"][t], d["actions"][s]

    def field(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
        def set_it(d: dict[str, Any]) -> None:
            d["actions"][s][i][key] = value

        return set_it

    def forge(d: dict[str, Any]) -> None:
        d["evaluation"].update(feasible=True, makespan=1e-9, violations=[])

    def pad(d: dict[str, Any]) -> None:  # larger than any schedule of this problem can be
        d["actions"][s] = d["actions"][s] * 3500  # about 1.5 MB, above the 1.06 MB cap

    mutated("an action cut", cut, DAMAGED)
    mutated("an action twice", duplicate, DAMAGED)
    mutated("a stage shuffled", reorder, ANY)
    mutated("a stage reversed", reverse, DAMAGED)
    mutated("a stage dropped", drop_stage, DAMAGED)
    mutated("a stage added", extra_stage, DAMAGED)
    mutated("two stages swapped", swap, ANY)
    mutated("chunk 5", field("chunk", 5), DAMAGED)
    mutated("mb 10**6", field("mb", 10**6), INVALID)
    mutated("mb 2**64", field("mb", 2**64), INVALID)
    mutated("mb -1", field("mb", -1), INVALID)
    mutated("mb '1'", field("mb", "1"), INVALID)
    mutated("mb 1.0", field("mb", 1.0), INVALID)
    mutated("op ['F']", field("op", ["F"]), INVALID)
    mutated("op 'X'", field("op", "X"), INVALID)
    mutated("a forged evaluation", forge, ANY)
    mutated("padded to 3500x", pad, INVALID)
    mutated("generator 1000 long", lambda d: d.update(generator="g" * 1000), INVALID)
    mutated("problem_hash changed", lambda d: d.update(problem_hash="0" * 16), INVALID)
    return cases


# ---- running ---------------------------------------------------------------------------------


def _invoke(args: list[str]) -> tuple[int, str]:
    res = runner.invoke(app, args)
    exc = res.exception
    assert exc is None or isinstance(exc, SystemExit), f"{args}: {type(exc).__name__}: {exc}"
    assert "Traceback" not in res.output, (args, res.output[-2000:])
    assert "internal error" not in res.stderr, (args, res.stderr)
    assert res.exit_code in (0, 1, 2), (args, res.exit_code, res.output[-2000:])
    if res.exit_code == 2:
        lines = res.stderr.strip("\n").split("\n")
        assert len(lines) == 1 and lines[0].startswith("optpipe: error: "), (args, res.stderr)
    return res.exit_code, res.stderr


def _check_problem_case(case: Case, path: Path, commands: list[list[str]]) -> None:
    valid = _is_valid_problem(case.data)
    if case.expect == INVALID:
        assert not valid, f"mislabelled case {case.name}: the model accepts it"
    for args in commands:
        code, err = _invoke([*args[:1], *args[1:]])
        if case.expect in (INVALID, TOO_LARGE):
            assert code == 2, (case.name, args, err)
        if code == 0:
            assert valid, f"{case.name}: {args[0]} exited 0 on a problem the model refuses"


def _write(tmp: Path, name: str, data: bytes) -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


def _problem_commands(path: Path, out: Path, solve: bool) -> list[list[str]]:
    commands = [
        ["compare", str(path), "--no-solve", "--json"],
        ["baseline", "1f1b", str(path), "--out", str(out)],
    ]
    if solve:
        commands += [  # the smallest limits these problems take: the work, not the wait
            ["solve", str(path), "--time-limit", "0.3", "--json", "--out", str(out)],
            ["compare", str(path), "--time-limit", "0.6", "--json"],
        ]
    return commands


def _run_problem_cases(seed: int, tmp_path: Path, solve: bool) -> int:
    rng = random.Random(seed)
    n = 0
    bases = ((TINY, "tiny"),) if solve else ((TINY, "tiny"), (PAPER, "paper"))
    for doc, label in bases:
        for case in problem_cases(rng, doc, label):
            path = _write(tmp_path, "p.json", case.data)
            _check_problem_case(case, path, _problem_commands(path, tmp_path / "o.json", solve))
            n += 1
    return n


def _tiny_schedules() -> list[tuple[Problem, Schedule]]:
    pb = Problem.model_validate(TINY)
    free = pb.with_changes(memory_limit=None, offload=None, name="tiny, unlimited")
    return [(pb, generate("adaoffload", pb)), (free, generate("zb-h1", free))]


def _run_schedule_cases(seed: int, tmp_path: Path) -> int:
    rng = random.Random(seed)
    db = f"sqlite:///{tmp_path}/fuzz.db"
    n = 0
    for pb, sched in _tiny_schedules():
        problem_path = _write(tmp_path, "p.json", _dumps(pb.model_dump(mode="json")))
        for case in schedule_cases(rng, sched, sched.generator):
            path = _write(tmp_path, "s.json", case.data)
            code, err = _invoke(["simulate", str(problem_path), str(path), "--json"])
            if case.expect == INVALID:
                assert code == 2, (case.name, err)
            if case.expect == DAMAGED:
                assert code in (1, 2), (case.name, "a damaged schedule simulated as feasible")
            code, err = _invoke(["trace", str(path), "--out", str(tmp_path / "t.json")])
            if case.expect in (INVALID, DAMAGED):
                assert code == 2, (case.name, err)
            export = _export_of(case.data, pb)
            if export is not None:
                path = _write(tmp_path, "e.json", export)
                code, err = _invoke(["db", "import", str(path), "--db", db])
                if case.expect in (INVALID, DAMAGED) or "forged" in case.name:
                    assert code == 2, (case.name, err)
            n += 1
    return n


def _export_of(schedule_bytes: bytes, pb: Problem) -> bytes | None:
    """An export document holding the (mutated) schedule as its text, when it is JSON."""
    try:
        text = schedule_bytes.decode()
        json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    head = json.dumps({"format": "optpipe.db-export/1", "problems": [pb.model_dump(mode="json")]})
    return (head[:-1] + ', "schedules": [{"source": "fuzz", "schedule": ' + text + "}]}").encode()


BAD_ARGUMENTS: list[tuple[list[str], str]] = [
    (["compare", "{p}", "--time-limit", "nan"], "--time-limit"),
    (["compare", "{p}", "--time-limit", "inf"], "--time-limit"),
    (["compare", "{p}", "--time-limit", "-1"], "--time-limit"),
    (["compare", "{p}", "--time-limit", "abc"], "--time-limit"),
    (["compare", "{p}", "--seed", str(2**64)], "--seed"),
    (["compare", "{p}", "--solver", "cplex"], "--solver"),
    (["compare", "{p}", "--bogus"], "No such option"),
    (["compare"], "Missing argument"),
    (["solve", "{p}", "--time-limit", "1e400"], "--time-limit"),
    (["solve", "{p}", "--time-limit", "0"], "--time-limit"),
    (["solve", "{p}", "--gap", "nan"], "--gap"),
    (["solve", "{p}", "--gap", "-0.5"], "--gap"),
    (["solve", "{p}", "--seed", "-1"], "--seed"),
    (["solve", "{p}", "--out", "{tmp}"], "directory"),
    (["solve", "{p}", "--out", "{tmp}/no/such/dir/s.json"], "does not exist"),
    (["baseline", "2f2b", "{p}"], "unknown baseline"),
    (["baseline", "1f1b", "{p}", "--time-limit", "nan"], "--time-limit"),
    (["simulate", "{p}"], "Missing argument"),
    (["simulate", "{p}", "{tmp}"], "directory"),
    (["trace", "{tmp}/none.json"], "no such file"),
    (["problem", "--stages", "0", "--layers", "8", "--hidden", "8", "--heads", "1", "--seq-len", "8"], "--stages"),
    (["problem", "--stages", "1000000000", "--layers", "8", "--hidden", "8", "--heads", "1", "--seq-len", "8"], "--stages"),
    (["problem", "--microbatches", str(2**64), "--layers", "8", "--hidden", "8", "--heads", "1", "--seq-len", "8"], "--microbatches"),
    (["problem", "--layers", "8", "--hidden", "8", "--heads", "1", "--seq-len", "8", "--memory-limit", "1e400GB"], "--memory-limit"),
    (["problem", "--layers", "8", "--hidden", "8", "--heads", "1", "--seq-len", "8", "--memory-limit", "nan"], "--memory-limit"),
    (["problem", "--layers", "8", "--hidden", "10000000000", "--heads", "1", "--seq-len", "8", "--stages", "2"], "must be"),
    (["problem", "--layers", "8", "--hidden", "8", "--heads", "1", "--seq-len", "8", "--efficiency", "nan"], "efficiency"),
    (["problem", "--from-profile", "1", "--db", "sqlite:///{tmp}/no/such.db"], "does not exist"),
    (["db", "show", "schedule", "abc", "--db", "sqlite:///{tmp}/a.db"], "integers"),
    (["db", "list", "--db", "not a url"], "not a database URL"),
    (["db", "import", "{p}", "--db", "sqlite:///{tmp}/a.db"], "not an optpipe export"),
    (["db", "frobnicate"], "No such command"),
    (["inspect", "--port", "70000", "--db", "sqlite:///{tmp}/a.db"], "out of range"),
    (["frobnicate"], "No such command"),
]  # fmt: skip


def test_bad_arguments_are_one_line_each(tmp_path: Path) -> None:
    p = _write(tmp_path, "p.json", _dumps(TINY))
    from optpipe_lightning.profiles_db import open_database

    open_database(f"sqlite:///{tmp_path}/a.db").close()
    for args, needle in BAD_ARGUMENTS:
        argv = [a.format(p=p, tmp=tmp_path) for a in args]
        code, err = _invoke(argv)
        assert code == 2 and needle in err, (argv, err)


def test_fuzzed_problems_through_every_command(tmp_path: Path) -> None:
    assert _run_problem_cases(seed=1, tmp_path=tmp_path, solve=False) >= 140


def test_fuzzed_schedules_through_simulate_trace_and_import(tmp_path: Path) -> None:
    assert _run_schedule_cases(seed=1, tmp_path=tmp_path) >= 60


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2])
def test_fuzzed_problems_through_the_solver_too(seed: int, tmp_path: Path) -> None:
    assert _run_problem_cases(seed=seed, tmp_path=tmp_path, solve=True) >= 70
    assert _run_schedule_cases(seed=seed, tmp_path=tmp_path) >= 60
