"""The ``optpipe`` command: solve, compare, simulate, build problems, export traces, inspect.

Exit code 0 on success, 2 on bad input with a one-line reason on stderr (never a traceback for a
user's mistake). ``--json`` output follows the contracts in DESIGN.md.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from .arguments import check_out_path, check_solver_options, write_output
from .command_errors import OneLineErrors
from .command_errors import fail as _fail
from .errors import UserError, load_model
from .schedule import Problem, Schedule, simulate
from .schedule.bounds import lower_bound
from .schedule.simulator import ScheduleMismatchError
from .schedule.units import format_bytes, format_seconds
from .size_guard import (
    MAX_PROBLEM_BYTES,
    MAX_TRACE_SCHEDULE_BYTES,
    CompareBudget,
    check_size,
    check_time_limit,
    check_trace_size,
    max_schedule_bytes,
    solver_seconds,
)

app = typer.Typer(
    name="optpipe",
    help="Memory-aware pipeline schedules: solve, compare, simulate, export, inspect.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=OneLineErrors,
)
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False)

T = TypeVar("T")
SHOWN_VIOLATIONS = 20


@contextmanager
def user_errors() -> Iterator[None]:
    """Print a user's mistake as one line on stderr and exit with code 2."""
    try:
        yield
    except typer.Exit:
        raise
    except (UserError, ScheduleMismatchError) as e:
        _fail(str(e))
    except Exception as e:
        # user errors of parts imported lazily (matched by name, subclasses included, so the
        # command line does not import the solver or the database to recognise them)
        if any(c.__name__ in _PART_USER_ERRORS for c in type(e).__mro__):
            _fail(str(e))
        raise


_PART_USER_ERRORS = frozenset(
    {"NotApplicable", "InfeasibleMemoryLimit", "DatabaseError", "TraceError"}
)


def _load_problem(path: Path) -> Problem:
    return load_model(path, Problem, "problem", MAX_PROBLEM_BYTES)


def _load_schedule(path: Path, max_bytes: int | None = None) -> Schedule:
    """A schedule file; ``max_bytes`` (``size_guard.max_schedule_bytes``) refuses one larger
    than any schedule of its problem before it is parsed."""
    return load_model(path, Schedule, "schedule", max_bytes)


# ---- formatting ------------------------------------------------------------------------------


def _fmt_time(seconds: float | None) -> str:
    return format_seconds(seconds)


def _fmt_bytes(x: float | None) -> str:
    return format_bytes(x, none="∞")


def _row(
    name: str,
    schedule: Schedule,
    bound: float | None,
    solve_seconds: float | None = None,
) -> dict[str, Any]:
    ev = schedule.evaluation
    assert ev is not None
    v, placement = _chunking_of(schedule)
    return {
        "name": name,
        "makespan": ev.makespan,
        "bubble_rate": ev.bubble_rate,
        "stage_span_bubble_rate": ev.stage_span_bubble_rate,
        "peak_memory": ev.peak_memory,
        "memory_limit": ev.memory_limit,
        "feasible": ev.feasible,
        "num_offloaded": ev.num_offloaded,
        "solve_seconds": solve_seconds,
        "lower_bound": bound,
        "num_chunks": v,
        "placement": placement,
    }


def _chunking_of(schedule: Schedule) -> tuple[int, str]:
    """The chunk count and placement a schedule was built for (recorded, else its problem's,
    else what its actions use)."""
    if schedule.num_chunks is not None:
        return schedule.num_chunks, schedule.placement or "interleaved"
    if schedule.problem is not None:
        from .schedule.chunking import own_chunking

        return own_chunking(schedule.problem)
    v = 1 + max((a.chunk for row in schedule.actions for a in row), default=0)
    return v, "interleaved"


def _problem_summary(problem: Problem, bound: float) -> dict[str, Any]:
    return {
        "hash": problem.hash,
        "name": problem.name,
        "num_stages": problem.num_stages,
        "num_microbatches": problem.num_microbatches,
        "num_chunks": problem.num_chunks,
        "placement": problem.placement,
        "memory_limit": problem.memory_limits(),
        "offload": problem.offload is not None,
        "lower_bound": bound,
    }


def _print_table(problem: Problem, rows: list[dict[str, Any]], skipped: dict[str, str]) -> None:
    chunked = problem.layers() is not None
    title = (
        f"problem {problem.hash}: p={problem.num_stages} m={problem.num_microbatches} "
        f"v={problem.num_chunks}" + (f" ({problem.placement})" if problem.num_chunks > 1 else "")
    )
    if problem.name:
        out.print(f"[dim]{problem.name}[/]", highlight=False)
    table = Table(title=title, title_justify="left")
    for col, justify in (
        ("schedule", "left"),
        *((("chunks", "left"),) if chunked else ()),
        ("makespan", "right"),
        ("bubble", "right"),
        ("stage-span", "right"),
        ("peak / limit", "right"),
        ("fits", "center"),
        ("offloads", "right"),
        ("solve", "right"),
        ("bound", "right"),
    ):
        table.add_column(col, justify=justify)
    best = min((r["makespan"] for r in rows if r["feasible"]), default=None)
    for r in rows:
        peaks, limits = r["peak_memory"], r["memory_limit"]
        i = max(range(len(peaks)), key=lambda k: peaks[k]) if peaks else 0
        lim = limits[i] if limits else None
        peak = f"{_fmt_bytes(peaks[i])} / {_fmt_bytes(lim)}" if peaks else "-"
        mk = _fmt_time(r["makespan"])
        if best is not None and r["feasible"] and r["makespan"] == best:
            mk = f"[bold green]{mk}[/]"
        chunks = f"v={r['num_chunks']}" + (f" {r['placement']}" if r["num_chunks"] > 1 else "")
        table.add_row(
            r["name"],
            *((chunks,) if chunked else ()),
            mk,
            "-" if r["bubble_rate"] is None else f"{r['bubble_rate']:.4f}",
            "-" if r["stage_span_bubble_rate"] is None else f"{r['stage_span_bubble_rate']:.4f}",
            peak,
            "[green]yes[/]" if r["feasible"] else "[red]no[/]",
            str(r["num_offloaded"]),
            _fmt_time(r["solve_seconds"]),
            _fmt_time(r["lower_bound"]),
        )
    out.print(table)
    for name, reason in skipped.items():
        out.print(f"[dim]{name}: not applicable: {reason}[/]")


# ---- commands --------------------------------------------------------------------------------

ProblemArg = Annotated[Path, typer.Argument(help="problem JSON (format optpipe.problem/1)")]


MarginOpt = Annotated[
    str | None,
    typer.Option(
        "--memory-margin",
        help="headroom kept free below each stage's memory limit: a fraction in [0, 1) "
        "(0.05) or bytes (2GB, 2e9, 512MiB)",
    ),
]


def _with_margin(problem: Problem, margin: str | None) -> Problem:
    if margin is None:
        return problem
    from .schedule.margin import apply_memory_margin

    try:
        return apply_memory_margin(problem, margin)
    except ValueError as e:
        raise UserError(f"--memory-margin: {e}") from None


def _least_bound(problem: Problem) -> float:
    """The lower bound over every chunking the problem allows (each chunking's bound holds for
    its own schedules only)."""
    from .schedule.chunking import chunkings, rechunk

    return min(lower_bound(rechunk(problem, v, pl)) for v, pl in chunkings(problem))


@app.command()
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
) -> None:
    """Every applicable baseline and the solver on one problem, side by side.

    With ``layers_per_stage`` every row shows its best chunking. Every baseline schedule is a
    candidate of the solver, so its row is never slower than a feasible row beside it.
    """
    started = time.perf_counter()
    with user_errors():
        problem = _with_margin(_load_problem(problem_path), memory_margin)
        budget = CompareBudget(problem, time_limit, solving=not no_solve, started=started)
        if not no_solve:
            check_solver_options(solver, seed)
        from .schedule.baselines import (
            BASELINE_NAMES,
            NotApplicable,
            best_schedule,
            generate_chunked,
        )
        from .schedule.baselines._deadline import DeadlineExceeded, deadline_at

        bound = _least_bound(problem)
        rows: list[dict[str, Any]] = []
        skipped: dict[str, str] = {}
        candidates: list[Schedule] = []  # the solver's: never slower than a row beside it
        for name in BASELINE_NAMES:
            if time.perf_counter() > budget.baselines_until:  # none starts after its share
                skipped[name] = budget.stopped
                continue
            try:
                with deadline_at(budget.baselines_until):
                    made = generate_chunked(name, problem)
            except NotApplicable as e:
                skipped[name] = str(e)
                continue
            except DeadlineExceeded:
                skipped[name] = budget.stopped
                continue
            except (ImportError, AttributeError):
                skipped[name] = "not available in this build"
                continue
            candidates += made
            rows.append(_row(name, best_schedule(made), bound))
        if not no_solve:
            result = _run_solver(
                problem,
                solver,
                budget.solver_seconds(),
                seed,
                quiet=as_json,
                db_url=None,
                candidates=candidates,
            )
            rows.append(_row("optpipe", result.schedule, result.lower_bound, result.solve_seconds))
        if as_json:
            doc = {
                "problem": _problem_summary(problem, bound),
                "schedules": rows,
                "not_applicable": [{"name": k, "reason": v} for k, v in skipped.items()],
            }
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        else:
            _print_table(problem, rows, skipped)


def _run_solver(
    problem: Problem,
    backend: str,
    time_limit: float,
    seed: int,
    *,
    quiet: bool,
    db_url: str | None,
    gap: float = 0.0,
    candidates: list[Schedule] | None = None,
) -> Any:
    from .solver import solve

    callbacks: list[Callable[[Any], None]] = []
    recorder = None
    run_id = None
    db = None
    if db_url is not None:
        from .profiles_db import open_database
        from .profiles_db import repository as repo

        db = open_database(db_url)
        with db.session() as s:
            repo.store_problem(s, problem)
            run_id = repo.start_solver_run(
                s, problem.hash, backend, {"time_limit": time_limit, "seed": seed, "gap": gap}
            )
        recorder = repo.SolverEventRecorder(db, run_id)
        callbacks.append(recorder)

    def on_incumbent(inc: Any) -> None:
        for cb in callbacks:
            cb(inc)

    progress: AbstractContextManager[Any] = nullcontext()
    if not quiet and out.is_terminal:
        from .solver.progress import RichSolveProgress

        progress = RichSolveProgress(problem, time_limit)
    try:
        with progress as display:
            if display is not None:
                callbacks.append(display)
            result = solve(
                problem,
                backend=backend,
                time_limit=time_limit,
                seed=seed,
                gap_target=gap,
                on_incumbent=on_incumbent,
                # compare's baselines (every chunking) are candidates: they need not run again
                candidates=candidates or (),
                use_baselines=candidates is None,
            )
    except BaseException as e:  # the run ends here: never leave it "running"
        if db is not None and recorder is not None and run_id is not None:
            _end_run(
                db,
                recorder,
                run_id,
                "interrupted" if isinstance(e, KeyboardInterrupt) else "failed",
            )
        raise
    if result.message and not quiet:
        err.print(f"optpipe: note: {result.message}", markup=False)
    if db is not None and recorder is not None and run_id is not None:
        from .profiles_db import repository as repo

        recorder.close()
        with db.session() as s:
            # the schedule embeds the problem it was built for (a re-chunking of this one)
            sid = repo.store_schedule(s, result.schedule, source="solver")
            repo.finish_solver_run(
                s,
                run_id,
                status=result.status,
                makespan=result.makespan,
                lower_bound=result.lower_bound,
                schedule_id=sid,
            )
    return result


def _end_run(db: Any, recorder: Any, run_id: int, status: str) -> None:
    """Close a run the solve could not finish (best effort: the solve's error is what counts)."""
    from .profiles_db import repository as repo

    recorder.close()
    try:
        with db.session() as s:
            repo.finish_solver_run(
                s, run_id, status=status, makespan=None, lower_bound=None, schedule_id=None
            )
    except Exception as e:
        err.print(f"optpipe: note: could not mark solver run {run_id} {status}: {e}", markup=False)


@app.command()
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
        problem = _with_margin(_load_problem(problem_path), memory_margin)
        check_size(problem, "solve")
        check_time_limit(problem, time_limit, "solve")
        check_solver_options(solver, seed, gap)
        check_out_path(out_path)
        left = solver_seconds(problem, time_limit, started)  # the command holds the limit
        result = _run_solver(problem, solver, left, seed, quiet=as_json, db_url=db, gap=gap)
        if out_path is not None:
            write_output(out_path, result.schedule.to_json(indent=1))
        summary = {
            "problem": problem.hash,
            "status": result.status,
            "backend": result.backend,
            **_row("optpipe", result.schedule, result.lower_bound, result.solve_seconds),
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
                f"{_fmt_time(result.makespan)}, bound {_fmt_time(result.lower_bound)}, "
                f"gap {result.gap:.2%}, {ev.num_offloaded if ev else 0} offloads, "
                f"solved in {_fmt_time(result.solve_seconds)}"
                + (f" -> {out_path}" if out_path else "")
            )


@app.command()
def baseline(
    name: Annotated[str, typer.Argument(help="gpipe, 1f1b, zb-h1, zbv, adaoffload, ...")],
    problem_path: ProblemArg,
    out_path: Annotated[
        Path | None, typer.Option("--out", help="write the schedule JSON here (default: stdout)")
    ] = None,
    time_limit: Annotated[
        float, typer.Option(help="give up after this many seconds (the slow generators)")
    ] = 60.0,
) -> None:
    """Export one baseline's schedule (evaluated, problem embedded) as a schedule file."""
    with user_errors():
        problem = _load_problem(problem_path)
        check_size(problem, "baseline")
        check_out_path(out_path)
        from .schedule.baselines import BASELINE_NAMES, generate
        from .schedule.baselines._deadline import DeadlineExceeded, deadline_at

        if name not in BASELINE_NAMES:
            raise UserError(f"unknown baseline {name!r}; one of {', '.join(BASELINE_NAMES)}")
        budget = CompareBudget(problem, time_limit, solving=False)
        try:
            with deadline_at(budget.baselines_until):
                sched = generate(name, problem)
        except DeadlineExceeded:
            raise UserError(f"{name}: {budget.stopped}") from None
        text = sched.to_json(indent=1)
        if out_path is None:
            sys.stdout.write(text + "\n")
        else:
            write_output(out_path, text + "\n")
            ev = sched.evaluation
            assert ev is not None
            err.print(
                f"wrote {out_path}: {name}, makespan {_fmt_time(ev.makespan)}, "
                f"{'fits' if ev.feasible else 'does NOT fit'}",
                markup=False,
            )


def _schedule_cap(problem: Problem) -> int:
    """The largest schedule file of ``problem`` or of any re-chunking of it."""
    from .schedule.chunking import chunk_counts

    most = max(chunk_counts(problem))
    return max_schedule_bytes(problem) * max(1, most // problem.num_chunks)


def _schedule_problem(
    problem: Problem, schedule: Schedule, schedule_path: Path, problem_path: Path
) -> Problem:
    """The problem to check a schedule against: the one given, or the re-chunking of it the
    schedule was built for (``layers_per_stage``)."""
    from .schedule.chunking import problem_for

    try:
        return problem_for(problem, schedule)
    except ScheduleMismatchError:
        raise UserError(
            f"{schedule_path} was made for problem {schedule.problem_hash}, but "
            f"{problem_path} is problem {problem.hash} (and not a re-chunking of it); "
            "simulate it with its own problem"
        ) from None


@app.command(name="simulate")
def simulate_cmd(
    problem_path: ProblemArg,
    schedule_path: Annotated[Path, typer.Argument(help="schedule JSON (optpipe.schedule/1)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the evaluation as JSON")] = False,
) -> None:
    """Evaluate a given schedule on a problem: timing, memory, and every violation."""
    with user_errors():
        given = _load_problem(problem_path)
        check_size(given, "simulate")
        schedule = _load_schedule(schedule_path, _schedule_cap(given))
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
            _print_table(problem, [_row(schedule.generator, sched, lower_bound(problem))], {})
            for v in ev.violations[:SHOWN_VIOLATIONS]:
                out.print(f"[red]{v.kind}[/]: {v.message}", markup=True, highlight=False)
            if len(ev.violations) > SHOWN_VIOLATIONS:
                more = len(ev.violations) - SHOWN_VIOLATIONS
                out.print(f"... and {more} more violations (--json lists them all)")
        if not ev.feasible:
            raise typer.Exit(1)


@app.command()
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
        given = None if problem_path is None else _load_problem(problem_path)
        if given is not None:
            check_trace_size(given)
        schedule = _load_schedule(
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
        from .inspector.chrome_trace import chrome_trace

        doc = chrome_trace(problem, schedule)
        text = json.dumps(doc)
        write_output(out_path, text)
        out.print(
            f"wrote {out_path} ({len(doc['traceEvents'])} events, {len(text) / 1e6:.1f} MB); "
            "open it in Perfetto"
        )


@app.command()
def inspect(
    db: Annotated[
        str | None, typer.Option(help="database URL (default: the user database)")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="port on 127.0.0.1 (default: a free one)")
    ] = None,
    demo: Annotated[
        bool,
        typer.Option(
            "--demo",
            help="open a demo database: example problems with every baseline and solver runs, "
            "and a recorded training run (built on first use; with --db, built there)",
        ),
    ] = False,
) -> None:
    """Start the Streamlit inspector on 127.0.0.1 over a profiles database (read-only)."""
    with user_errors():
        try:
            from .inspector.launch import run_inspector
        except ImportError as e:
            raise UserError(
                f"the inspector needs its extra: pip install 'optpipe-lightning[inspector]' ({e})"
            ) from None
        if demo:
            from .demo import ensure_demo_database

            db = ensure_demo_database(db, log=lambda m: err.print(f"optpipe inspect: {m}"))
        raise typer.Exit(run_inspector(db, port))


def _mount_optional() -> None:
    try:
        from .profiles_db.cli import app as db_app
    except ImportError:
        return
    app.add_typer(db_app, name="db", help="List, show, export, import and prune the database.")


def _mount_problem() -> None:
    try:
        from .problem_cli import problem_command
    except ImportError:
        return
    app.command(name="problem")(problem_command)


_mount_optional()
_mount_problem()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
