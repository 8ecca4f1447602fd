"""The ``optpipe`` schedule commands: ``compare``, ``solve``, ``baseline``, ``simulate`` and
``trace`` (``cli.py`` puts them on the app). Their ``--json`` output follows DESIGN.md.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .arguments import check_out_path, check_solver_options, write_output
from .errors import UserError
from .inputs import MarginOpt, ProblemArg, load_problem, load_schedule, user_errors, with_margin
from .interrupt import exit_interrupted, last_signal, terminate_as_interrupt
from .output import (
    err,
    fmt_time,
    out,
    print_table,
    problem_summary,
    schedule_row,
    status_line,
)
from .size_guard import (
    MAX_TRACE_SCHEDULE_BYTES,
    CompareBudget,
    check_size,
    check_time_limit,
    check_trace_size,
    max_schedule_bytes,
    solver_seconds,
)
from .solver_run import run_solver

if TYPE_CHECKING:  # the schedule model (numpy, pydantic) loads when a command runs: --help is fast
    from ..schedule import Problem, Schedule
    from .records import CommandRecord

SHOWN_VIOLATIONS = 20


def _least_bound(problem: Problem) -> float:
    """The lower bound over every chunking the problem allows (each chunking's bound holds for
    its own schedules only)."""
    from ..schedule.bounds import lower_bound
    from ..schedule.chunking import chunkings, rechunk

    return min(lower_bound(rechunk(problem, v, pl)) for v, pl in chunkings(problem))


DbOpt = Annotated[
    str | None,
    typer.Option(
        help="store every row printed (baselines and the solver's) and one solver-run record "
        "in this database (SQLAlchemy URL)"
    ),
]


def compare(
    problem_path: ProblemArg,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON document")] = False,
    no_solve: Annotated[bool, typer.Option("--no-solve", help="baselines only")] = False,
    solver: Annotated[str, typer.Option(help="solver backend")] = "auto",
    time_limit: Annotated[
        float, typer.Option(help="seconds for the whole comparison (baselines, then the solver)")
    ] = 10.0,
    seed: Annotated[int, typer.Option(help="solver random seed")] = 0,
    memory_margin: MarginOpt = None,
    db: DbOpt = None,
) -> None:
    """Every applicable baseline and the solver on one problem, side by side.

    With ``layers_per_stage`` every row shows its best chunking. Every baseline schedule is a
    candidate of the solver, so its row is never slower than a feasible row beside it.
    """
    started = time.perf_counter()
    with user_errors():
        with status_line(f"compare: reading {problem_path}", enabled=not as_json) as say:
            problem = with_margin(load_problem(problem_path), memory_margin)
            if not no_solve:
                check_solver_options(solver, seed)
            budget = CompareBudget(problem, time_limit, solving=not no_solve, started=started)
            record = _start_record(
                db,
                problem,
                "baselines" if no_solve else solver,
                {"command": "compare", "time_limit": time_limit, "seed": seed},
            )
            if record is not None:  # opening (creating) the database is not the comparison's
                started = time.perf_counter()
                budget = CompareBudget(problem, time_limit, solving=not no_solve, started=started)
            try:
                bound = _least_bound(problem)
                with terminate_as_interrupt():  # Ctrl-C or SIGTERM: the rows so far, exit 130
                    rows, skipped, candidates, chosen = _compare_baselines(
                        problem, budget, bound, say, started
                    )
                interrupted = "interrupted" in skipped.values()
                if record is not None:
                    for row in rows:
                        record.store(row["name"], chosen[row["name"]], "baseline")
            except BaseException as e:
                if record is not None:
                    record.end("interrupted" if isinstance(e, KeyboardInterrupt) else "failed")
                raise
        status = "baselines"
        if not no_solve and not interrupted:
            try:
                with terminate_as_interrupt():
                    result = run_solver(
                        problem,
                        solver,
                        budget.solver_seconds(),
                        seed,
                        quiet=as_json,
                        record=record,
                        candidates=candidates,
                        finish=False,
                    )
            except KeyboardInterrupt:  # nothing beyond the baselines found yet (run ended)
                interrupted, record = True, None
            else:
                status = result.status
                interrupted = status == "interrupted"
                rows.append(
                    schedule_row(
                        "optpipe", result.schedule, result.lower_bound, result.solve_seconds
                    )
                )
        if record is not None:
            from .records import best_row

            best = best_row(rows)
            record.finish(
                "interrupted" if interrupted else status,
                None if best is None else best["makespan"],
                bound,
                None if best is None else record.schedule_ids.get(best["name"]),
            )
        if as_json:
            doc: dict[str, Any] = {
                "problem": problem_summary(problem, bound),
                "schedules": rows,
                "not_applicable": [{"name": k, "reason": v} for k, v in skipped.items()],
            }
            if interrupted:
                doc["interrupted"] = last_signal() or True
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        else:
            print_table(problem, rows, skipped, last_signal() if interrupted else None)
        if interrupted:
            exit_interrupted()


def _start_record(
    url: str | None, problem: Problem, backend: str, params: dict[str, Any]
) -> CommandRecord | None:
    if url is None:
        return None
    from .records import CommandRecord

    return CommandRecord.start(url, problem, backend, params)


def _compare_baselines(
    problem: Problem,
    budget: CompareBudget,
    bound: float,
    say: Callable[[str], None],
    started: float,
) -> tuple[list[dict[str, Any]], dict[str, str], list[Schedule], dict[str, Schedule]]:
    """Every applicable baseline within its share of the time: the rows, the reasons of those
    skipped, every schedule made (the solver's candidates) and each row's schedule. After
    Ctrl-C or SIGTERM (a ``KeyboardInterrupt``) the baselines not finished are skipped as
    ``"interrupted"``."""
    from ..schedule.baselines import (
        BASELINE_NAMES,
        NotApplicable,
        best_schedule,
        chunking_order,
        generate_chunkings,
    )
    from ..schedule.baselines._deadline import DeadlineExceeded, deadline_at
    from ..solver.candidates import STRONGEST_BASELINES, baseline_order

    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    candidates: list[Schedule] = []  # the solver's: never slower than a row beside it
    chosen: dict[str, Schedule] = {}
    made: dict[str, dict[int, Schedule]] = {}
    why: dict[str, dict[int, NotApplicable]] = {}
    interrupted = False  # (``terminate_as_interrupt`` makes SIGTERM a KeyboardInterrupt too)
    order = baseline_order(problem)  # under a memory limit the strongest come early
    strongest = [n for n in order if n in STRONGEST_BASELINES]
    # each step: a baseline on some of its chunkings. The strongest first make their likely
    # best chunking each (most chunks), then their others, so that on a busy machine every
    # strongest row has a schedule before any of them spends time on its other chunkings
    steps: list[tuple[str, list[int]]] = []
    for name in order:
        if name not in STRONGEST_BASELINES:
            steps.append((name, chunking_order(name, problem)))
        elif name == strongest[0]:
            firsts = {n: chunking_order(n, problem) for n in strongest}
            steps += [(n, idx[:1]) for n, idx in firsts.items()]
            steps += [(n, idx[1:]) for n, idx in firsts.items() if idx[1:]]
    for k, (name, indices) in enumerate(steps, 1):
        if interrupted:
            skipped.setdefault(name, "interrupted")
            continue
        until = budget.strongest_until if name in STRONGEST_BASELINES else budget.baselines_until
        if time.perf_counter() > until:  # none starts after its share
            skipped.setdefault(name, budget.stopped)
            continue
        say(f"compare: baseline {name} ({k}/{len(steps)}, {time.perf_counter() - started:.1f} s)")
        try:
            with deadline_at(until):
                done, na = generate_chunkings(name, problem, indices)
            made.setdefault(name, {}).update(done)
            why.setdefault(name, {}).update(na)
        except KeyboardInterrupt:
            interrupted = True
            skipped.setdefault(name, "interrupted")
        except DeadlineExceeded:
            skipped.setdefault(name, budget.stopped)
        except (ImportError, AttributeError):
            skipped.setdefault(name, "not available in this build")
    for name, done in made.items():
        if done:
            skipped.pop(name, None)  # (a later step of it stopped: the chunkings made count)
        elif name not in skipped and why.get(name):
            skipped[name] = str(why[name][min(why[name])])  # the own chunking's, else the first
    made_by = {n: [d[i] for i in sorted(d)] for n, d in made.items() if d}
    # rows (and reasons) in the usual order, whatever order they were computed in
    skipped = {n: skipped[n] for n in BASELINE_NAMES if n in skipped}
    for name in BASELINE_NAMES:
        if name in made_by:
            candidates += made_by[name]
            chosen[name] = best_schedule(made_by[name])
            rows.append(schedule_row(name, chosen[name], bound))
    return rows, skipped, candidates, chosen


def solve(
    problem_path: ProblemArg,
    solver: Annotated[str, typer.Option(help="auto | cpsat | gurobi | highs | heuristic")] = "auto",
    time_limit: Annotated[float, typer.Option(help="seconds")] = 60.0,
    gap: Annotated[float, typer.Option(help="stop at this relative gap (0 = prove optimal)")] = 0.0,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    out_path: Annotated[
        Path | None, typer.Option("--out", help="write the schedule JSON here")
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(help="record the run and schedule in this database (SQLAlchemy URL)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON summary")] = False,
    memory_margin: MarginOpt = None,
) -> None:
    """The fastest schedule that fits the memory limit, with offload decisions and a bound.

    With ``layers_per_stage`` it also chooses the chunk count and placement."""
    started = time.perf_counter()
    with user_errors():
        given = load_problem(problem_path)
        problem = with_margin(given, memory_margin)
        check_size(problem, "solve")
        check_time_limit(problem, time_limit, "solve")
        check_solver_options(solver, seed, gap)
        check_out_path(out_path)
        left = solver_seconds(problem, time_limit, started)  # the command holds the limit
        record = _start_record(
            db, problem, solver, {"time_limit": time_limit, "seed": seed, "gap": gap}
        )
        retarget = None
        if problem is not given:  # solved with a margin: for the real limit, with its budget
            from ..schedule.margin import budgeted_for

            def retarget(schedule: Schedule) -> Schedule:
                return budgeted_for(schedule, given)

        result = run_solver(
            problem,
            solver,
            left,
            seed,
            quiet=as_json,
            record=record,
            gap=gap,
            retarget=retarget,
        )
        interrupted = result.status == "interrupted"  # by a signal: the best found, exit 130
        if out_path is not None:
            write_output(out_path, result.schedule.to_json(indent=1))
        summary = {
            "problem": given.hash,
            "status": result.status,
            "backend": result.backend,
            **schedule_row("optpipe", result.schedule, result.lower_bound, result.solve_seconds),
            "gap": result.gap,
            "first_solution_seconds": result.first_solution_seconds,
            "out": str(out_path) if out_path else None,
        }
        if as_json:
            sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        else:
            ev = result.schedule.evaluation
            out.print(
                f"[bold]{result.status}[/] ({result.backend}): makespan "
                f"{fmt_time(result.makespan)}, bound {fmt_time(result.lower_bound)}, "
                f"gap {result.gap:.2%}, {ev.num_offloaded if ev else 0} offloads, "
                f"solved in {fmt_time(result.solve_seconds)}"
                + (f" -> {out_path}" if out_path else "")
            )
        if interrupted:
            exit_interrupted()


def baseline(
    name: Annotated[str, typer.Argument(help="gpipe, 1f1b, zb-h1, zbv, adaoffload, ...")],
    problem_path: ProblemArg,
    out_path: Annotated[
        Path | None, typer.Option("--out", help="write the schedule JSON here (default: stdout)")
    ] = None,
    time_limit: Annotated[
        float, typer.Option(help="give up after this many seconds (the slow generators)")
    ] = 60.0,
    db: Annotated[
        str | None,
        typer.Option(help="also store the schedule and one run record in this database (URL)"),
    ] = None,
) -> None:
    """Export one baseline's schedule (evaluated, problem embedded) as a schedule file."""
    started = time.perf_counter()  # the limit counts from here, reading the problem included
    with user_errors():
        problem = load_problem(problem_path)
        check_size(problem, "baseline")
        check_out_path(out_path)
        from ..schedule.baselines import BASELINE_NAMES, generate
        from ..schedule.baselines._deadline import DeadlineExceeded, deadline_at

        if name not in BASELINE_NAMES:
            raise UserError(f"unknown baseline {name!r}; one of {', '.join(BASELINE_NAMES)}")
        budget = CompareBudget(
            problem, time_limit, solving=False, started=started, command="baseline"
        )
        params = {"command": "baseline", "baseline": name, "time_limit": time_limit}
        record = _start_record(db, problem, "baselines", params)
        try:
            with deadline_at(budget.baselines_until):
                sched = generate(name, problem)
            if record is not None:
                ev = sched.evaluation
                sid = record.store(name, sched, "baseline")
                record.finish("baselines", ev.makespan if ev else None, None, sid)
        except BaseException as e:
            if record is not None:
                record.end("interrupted" if isinstance(e, KeyboardInterrupt) else "failed")
            if isinstance(e, DeadlineExceeded):
                raise UserError(f"{name}: {budget.stopped}") from None
            raise
        text = sched.to_json(indent=1)
        if out_path is None:
            sys.stdout.write(text + "\n")
        else:
            write_output(out_path, text + "\n")
            ev = sched.evaluation
            assert ev is not None
            err.print(
                f"wrote {out_path}: {name}, makespan {fmt_time(ev.makespan)}, "
                f"{'fits' if ev.feasible else 'does NOT fit'}",
                markup=False,
            )


def _schedule_cap(problem: Problem) -> int:
    """The largest schedule file of ``problem`` or of any re-chunking of it."""
    from ..schedule.chunking import chunk_counts

    most = max(chunk_counts(problem))
    return max_schedule_bytes(problem) * max(1, most // problem.num_chunks)


def _schedule_problem(
    problem: Problem, schedule: Schedule, schedule_path: Path, problem_path: Path
) -> Problem:
    """The problem to check a schedule against: the one given, or the re-chunking of it the
    schedule was built for (``layers_per_stage``)."""
    from ..schedule.chunking import problem_for
    from ..schedule.simulator import ScheduleMismatchError

    try:
        return problem_for(problem, schedule)
    except ScheduleMismatchError:
        raise UserError(
            f"{schedule_path} was made for problem {schedule.problem_hash}, but "
            f"{problem_path} is problem {problem.hash} (and not a re-chunking of it); "
            "give the problem file it was made for"
        ) from None


def simulate_cmd(
    problem_path: ProblemArg,
    schedule_path: Annotated[Path, typer.Argument(help="schedule JSON (optpipe.schedule/1)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the evaluation as JSON")] = False,
) -> None:
    """Evaluate a given schedule on a problem: timing, memory, and every violation."""
    with user_errors():
        from ..schedule import simulate
        from ..schedule.bounds import lower_bound

        given = load_problem(problem_path)
        check_size(given, "simulate")
        schedule = load_schedule(schedule_path, _schedule_cap(given))
        problem = _schedule_problem(given, schedule, schedule_path, problem_path)
        check_size(problem, "simulate")
        ev = simulate(problem, schedule).evaluation
        if as_json:
            sys.stdout.write(
                json.dumps(
                    {
                        "problem": problem.hash,
                        "generator": schedule.generator,
                        **ev.model_dump(mode="json"),
                        "lower_bound": lower_bound(problem),
                    },
                    indent=2,
                )
                + "\n"
            )
        else:
            sched = schedule.with_evaluation(ev)
            print_table(
                problem, [schedule_row(schedule.generator, sched, lower_bound(problem))], {}
            )
            for v in ev.violations[:SHOWN_VIOLATIONS]:
                out.print(f"[red]{v.kind}[/]: {v.message}", markup=True, highlight=False)
            if len(ev.violations) > SHOWN_VIOLATIONS:
                more = len(ev.violations) - SHOWN_VIOLATIONS
                out.print(f"... and {more} more violations (--json lists them all)")
        if not ev.feasible:
            raise typer.Exit(1)


def trace(
    schedule_path: Annotated[Path, typer.Argument(help="schedule JSON")],
    out_path: Annotated[Path, typer.Option("--out", help="trace file to write")] = Path(
        "trace.json"
    ),
    problem_path: Annotated[
        Path | None,
        typer.Option("--problem", help="the problem (default: the one embedded in the schedule)"),
    ] = None,
) -> None:
    """Write a Chrome trace (open it in https://ui.perfetto.dev) of a schedule's timeline."""
    with user_errors():
        from ..schedule import simulate

        given = None if problem_path is None else load_problem(problem_path)
        if given is not None:
            check_trace_size(given)
        schedule = load_schedule(
            schedule_path, MAX_TRACE_SCHEDULE_BYTES if given is None else _schedule_cap(given)
        )
        check_out_path(out_path)
        if given is not None and problem_path is not None:
            problem = _schedule_problem(given, schedule, schedule_path, problem_path)
            check_trace_size(problem)
        elif schedule.problem is not None:
            problem = schedule.problem
        else:
            raise UserError(
                f"{schedule_path} does not embed its problem; pass --problem PROBLEM.json"
            )
        if schedule.problem_hash != problem.hash:
            raise UserError(
                f"{schedule_path} was made for problem {schedule.problem_hash}, not {problem.hash}"
            )
        check_trace_size(problem)
        ev = simulate(problem, schedule).evaluation
        if ev.makespan is None:
            raise UserError(f"{schedule_path} cannot be timed: {ev.violations[0].message}")
        from ..inspector.chrome_trace import chrome_trace

        doc = chrome_trace(problem, schedule)
        text = json.dumps(doc)
        write_output(out_path, text)
        out.print(
            f"wrote {out_path} ({len(doc['traceEvents'])} events, {len(text) / 1e6:.1f} MB); "
            "open it in Perfetto"
        )
