"""``optpipe db``: list, show, export, import, delete and prune the profiles database.

Every command takes ``--db URL`` (default: ``$OPTPIPE_DB_URL``, else the SQLite file under
``$XDG_DATA_HOME/optpipe/``). Errors print one line on stderr and exit with code 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..profiles_db.errors import DatabaseError
from .command_errors import OneLineErrors, one_line
from .command_errors import fail as _fail
from .errors import counted

if TYPE_CHECKING:  # SQLAlchemy and the models load when a command runs: --help stays fast
    from sqlalchemy.orm import Session

    from ..profiles_db.database import Database

app = typer.Typer(
    help="The profiles database: measured profiles, schedules, solver and training runs.",
    no_args_is_help=True,
    add_completion=False,
    cls=OneLineErrors,
)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Database URL (default: $OPTPIPE_DB_URL, else "
        "sqlite:///$XDG_DATA_HOME/optpipe/optpipe.db).",
        show_default=False,
    ),
]


class ListWhat(StrEnum):
    all = "all"
    problems = "problems"
    schedules = "schedules"
    profiles = "profiles"
    solver_runs = "solver-runs"
    training_runs = "training-runs"


class ShowWhat(StrEnum):
    problem = "problem"
    schedule = "schedule"
    profile = "profile"
    solver_run = "solver-run"
    training_run = "training-run"


def _repo() -> ModuleType:
    from ..profiles_db import repository

    return repository


@contextmanager
def _open(url: str | None, *, read_only: bool) -> Iterator[Database]:
    from ..profiles_db.database import default_database_url, open_database

    try:
        db = open_database(url if url is not None else default_database_url(), read_only=read_only)
    except DatabaseError as e:
        _fail(str(e))
    try:
        yield db
    except DatabaseError as e:
        _fail(str(e))
    finally:
        db.close()


def _int_id(value: str, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        _fail(f"{what} ids are integers, got {value!r} (see `optpipe db list`)")


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    if hasattr(v, "strftime"):
        return str(v.strftime("%Y-%m-%d %H:%M:%S"))
    return str(v)


BYTE_COLUMNS = frozenset({"memory_limit"})


def _fmt_column(column: str, v: Any) -> str:
    """A cell: bytes in the one byte unit every optpipe table uses (``73.01 GB``)."""
    if column in BYTE_COLUMNS and isinstance(v, int | float):
        from ..schedule.units import format_bytes

        return format_bytes(float(v))
    return _fmt(v)


def _table(title: str, rows: list[Any], columns: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{title} ({len(rows)})", title_justify="left")
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*(_fmt_column(c, getattr(r, c)) for c in columns))
    Console(width=None if sys.stdout.isatty() else 200).print(table)


_LISTS: dict[ListWhat, tuple[Callable[[Session, str | None], list[Any]], list[str]]] = {
    ListWhat.problems: (
        lambda s, h: [r for r in _repo().list_problems(s) if h is None or r.hash == h],
        ["hash", "name", "num_stages", "num_microbatches", "num_chunks", "memory_limit",
         "offload", "num_schedules", "best_makespan"],
    ),
    ListWhat.schedules: (
        lambda s, h: _repo().list_schedules(s, h),
        ["id", "problem_hash", "generator", "source", "makespan", "feasible", "bubble_rate",
         "num_offloaded", "created_at"],
    ),
    ListWhat.profiles: (
        lambda s, h: _repo().list_profiles(s),
        ["id", "device_kind", "device_count", "torch_version", "model_name", "num_stages",
         "num_chunks", "microbatch_size", "measured_at", "hardware_key", "model_key"],
    ),
    ListWhat.solver_runs: (
        lambda s, h: _repo().list_solver_runs(s, h),
        ["id", "problem_hash", "backend", "status", "makespan", "lower_bound", "num_events",
         "schedule_id", "started_at"],
    ),
    ListWhat.training_runs: (
        lambda s, h: _repo().list_training_runs(s),
        ["id", "model_name", "device_kind", "status", "num_steps", "started_at",
         "finished_at"],
    ),
}  # fmt: skip


@app.command("list")
def list_(
    what: Annotated[ListWhat, typer.Argument(help="What to list.")] = ListWhat.all,
    problem: Annotated[
        str | None, typer.Option("--problem", help="Only this problem hash.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    db: DbOption = None,
) -> None:
    """List problems, schedules, profiles, solver runs and training runs."""
    kinds = list(_LISTS) if what is ListWhat.all else [what]
    with _open(db, read_only=True) as database, database.session() as s:
        found = {k: _LISTS[k][0](s, problem) for k in kinds}
    if as_json:
        _print_json({k.value: [r.to_dict() for r in rows] for k, rows in found.items()})
        return
    for k, rows in found.items():
        _table(k.value, rows, _LISTS[k][1])


@app.command()
def show(
    what: Annotated[ShowWhat, typer.Argument(help="Kind of row.")],
    ident: Annotated[str, typer.Argument(metavar="ID", help="Problem hash or row id.")],
    db: DbOption = None,
) -> None:
    """Print one stored item as JSON (a run with its events, steps and switches)."""
    repo = _repo()
    with _open(db, read_only=True) as database, database.session() as s:
        doc: Any
        if what is ShowWhat.problem:
            p = repo.get_problem(s, ident)
            if p is None:
                _fail(f"no problem with hash {ident!r} in the database (see `optpipe db list`)")
            doc = p.model_dump(mode="json")
        elif what is ShowWhat.schedule:
            doc = repo.get_schedule(s, _int_id(ident, "schedule")).model_dump(mode="json")
        elif what is ShowWhat.profile:
            doc = repo.get_profile(s, _int_id(ident, "profile")).model_dump(mode="json")
        elif what is ShowWhat.solver_run:
            rid = _int_id(ident, "solver run")
            run = repo.get_solver_run(s, rid)
            doc = run.to_dict() | {"events": [e.to_dict() for e in repo.solver_events(s, rid)]}
            if run.schedule_id is not None:  # also a run killed before it ended: its incumbent
                doc["best_schedule"] = f"optpipe db show schedule {run.schedule_id} > best.json" + (
                    f" (the best incumbent of a run {run.status})"
                    if run.status in ("running", "interrupted", "failed")
                    else ""
                )
        else:
            rid = _int_id(ident, "training run")
            runs = [r for r in repo.list_training_runs(s) if r.id == rid]
            if not runs:
                _fail(f"no training run with id {rid} in the database (see `optpipe db list`)")
            doc = runs[0].to_dict() | {
                "steps": [r.to_dict() for r in repo.training_steps(s, rid)],
                "switches": [r.to_dict() for r in repo.schedule_switches(s, rid)],
            }
    _print_json(doc)


@app.command()
def export(
    out: Annotated[Path, typer.Argument(help="JSON file to write ('-' for stdout).")],
    profiles: Annotated[bool, typer.Option(help="Include measured profiles.")] = True,
    schedules: Annotated[bool, typer.Option(help="Include problems and schedules.")] = True,
    problem: Annotated[
        str | None, typer.Option("--problem", help="Only this problem's schedules.")
    ] = None,
    db: DbOption = None,
) -> None:
    """Write profiles, problems and schedules to one JSON file (to move them between machines)."""
    from ..profiles_db.transfer import export_document

    skipped: list[str] = []  # rows that do not read: everything else is exported
    with _open(db, read_only=True) as database, database.session() as s:
        doc = export_document(
            s, profiles=profiles, schedules=schedules, problem_hash=problem, skipped=skipped
        )
    for what in skipped:
        typer.echo(f"optpipe: warning: skipped {one_line(what)}", err=True)
    text = doc.model_dump_json(indent=1)
    if str(out) == "-":
        sys.stdout.write(text + "\n")
        return
    try:
        out.write_text(text + "\n")
    except OSError as e:
        _fail(f"cannot write {out}: {e.strerror}")
    typer.echo(
        f"exported {counted(len(doc.problems), 'problem')}, "
        f"{counted(len(doc.schedules), 'schedule')}, {counted(len(doc.profiles), 'profile')} "
        f"to {out}"
        + (
            f"; skipped {counted(len(skipped), 'row')} that do not read (listed above; "
            "`optpipe db delete` removes them)"
            if skipped
            else ""
        ),
        err=True,
    )


@app.command("import")
def import_(
    src: Annotated[
        Path,
        typer.Argument(
            help="JSON file written by `optpipe db export`, or a schedule file "
            "(`optpipe baseline NAME PROBLEM --out FILE`, `optpipe solve --out FILE`)."
        ),
    ],
    db: DbOption = None,
) -> None:
    """Store the profiles, problems and schedules of an export file, or one schedule file
    (with its embedded problem); what is already stored is skipped.

    Nothing in the file is trusted: every schedule is simulated again (one whose evaluation
    says otherwise is refused), every problem hash recomputed, every profile checked against
    the model it claims; any refusal stores nothing.
    """
    from pydantic import ValidationError

    from ..profiles_db.transfer import EXPORT_FORMAT, ExportDocument, import_document
    from .errors import UserError, describe_validation_error
    from .input_files import decode, parse_json, read_bytes

    try:
        raw = read_bytes(src, "export")
    except UserError as e:
        _fail(f"cannot read {src}: {str(e).removeprefix(f'{src}: ')}")
    hint = "write one with `optpipe db export`"
    try:
        data = parse_json(decode(raw, src), src)
    except UserError as e:
        _fail(f"{src} is not an optpipe export ({str(e).removeprefix(f'{src}: ')}); {hint}")
    if isinstance(data, dict) and data.get("format") == "optpipe.schedule/1":
        _import_schedule(src, data, db)
        return
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        _fail(f"{src} is not an optpipe export (no format {EXPORT_FORMAT!r}); {hint}")
    try:
        doc = ExportDocument.model_validate(data, strict=True)
    except ValidationError as e:
        _fail(f"{src} is not an optpipe export ({describe_validation_error(e)}); {hint}")
    from .size_guard import check_size

    embedded = [e.schedule.problem for e in doc.schedules if e.schedule.problem is not None]
    try:  # every schedule is simulated again: no problem larger than `optpipe simulate` takes
        for problem in [*doc.problems, *embedded]:
            check_size(problem, "simulate")
    except UserError as e:
        _fail(f"{src}: {e}")
    with _open(db, read_only=False) as database:
        try:
            with database.session() as s:
                counts = import_document(s, doc)
        except ValueError as e:
            _fail(f"{src}: {e}")
    typer.echo(
        f"imported {counted(counts.problems, 'new problem')}, "
        f"{counted(counts.schedules, 'new schedule')}, {counted(counts.profiles, 'new profile')}",
        err=True,
    )


def _import_schedule(src: Path, data: dict[str, Any], db: str | None) -> None:
    """Store one schedule file (a baseline's or the solver's, its problem embedded)."""
    from pydantic import ValidationError

    from ..schedule import Schedule
    from .errors import UserError, describe_validation_error
    from .size_guard import check_size

    try:
        schedule = Schedule.model_validate(data)
    except ValidationError as e:
        _fail(f"{src} is not a valid schedule ({describe_validation_error(e)})")
    if schedule.problem is None:
        _fail(
            f"{src} does not embed its problem: write it with `optpipe baseline NAME PROBLEM "
            "--out FILE` (which embeds it), or store it with its problem in an export file"
        )
    try:
        check_size(schedule.problem, "simulate")  # it is simulated again before it is stored
    except UserError as e:
        _fail(f"{src}: {e}")
    source = "solver" if schedule.generator == "optpipe" else "baseline"
    with _open(db, read_only=False) as database:
        repo = _repo()
        try:
            with database.session() as s:
                before = {r.id for r in repo.list_schedules(s, schedule.problem_hash)}
                sid = repo.store_schedule(s, schedule, source=source)
        except ValueError as e:
            _fail(f"{src}: {e}")
    state = "already stored" if sid in before else "imported"
    typer.echo(
        f"{state}: schedule {sid} ({schedule.generator}) of problem {schedule.problem_hash}",
        err=True,
    )


@app.command()
def delete(
    what: Annotated[ShowWhat, typer.Argument(help="Kind of row.")],
    ident: Annotated[str, typer.Argument(metavar="ID", help="Problem hash or row id.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")] = False,
    db: DbOption = None,
) -> None:
    """Delete one row by id with its dependants (a problem: its schedules and solver runs; a
    run: its events or steps). Damaged rows too: nothing of the row is read."""
    from ..profiles_db.delete import delete_plan, delete_rows
    from ..profiles_db.errors import NotFoundError

    key: str | int = ident if what is ShowWhat.problem else _int_id(ident, what.value)
    with _open(db, read_only=False) as database:
        try:
            with database.session() as s:
                plan = delete_plan(s, what.value, key)
        except NotFoundError as e:
            _fail(str(e))
        said = ", ".join(f"{n} {k}" for k, n in plan.items() if n)
        if not yes:
            try:
                ok = typer.confirm(f"delete {what.value} {ident}: {said}?", default=False)
            except typer.Abort:
                _fail(f"not confirmed: pass --yes to delete {what.value} {ident} without asking")
            if not ok:
                typer.echo("nothing deleted", err=True)
                raise typer.Exit(1)
        with database.session() as s:
            done = delete_rows(s, what.value, key)
    typer.echo(f"deleted {', '.join(f'{n} {k}' for k, n in done.items() if n)}")


@app.command()
def check(db: DbOption = None) -> None:
    """Check the file, the schema and every row of every table again; exit 2 on problems.

    Each problem is printed on stdout; stderr gets one line with the count and the first.
    """
    from ..profiles_db.database import head_revision

    with _open(db, read_only=True) as database:
        problems = database.check()
        revision = head_revision()
    if problems:
        for p in problems:
            typer.echo(p)
        _fail(
            f"database {database.where} has {counted(len(problems), 'problem')}, first: {problems[0]}; "
            "export what still reads (`optpipe db export`) and restore a backup"
        )
    typer.echo(f"ok: {database.where} (schema revision {revision})")


@app.command()
def prune(
    keep_profiles: Annotated[
        int, typer.Option(min=1, help="Newest profiles kept per (hardware, model).")
    ] = 1,
    keep_schedules: Annotated[
        int | None,
        typer.Option(min=1, help="Best schedules kept per problem (default: keep all)."),
    ] = None,
    older_than_days: Annotated[
        float | None,
        typer.Option(min=0, help="Delete finished runs started more than this many days ago."),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only count.")] = False,
    db: DbOption = None,
) -> None:
    """Delete superseded profiles, surplus schedules and old runs."""
    repo = _repo()
    with _open(db, read_only=dry_run) as database, database.session() as s:
        report = repo.prune(
            s,
            keep_profiles=keep_profiles,
            keep_schedules=keep_schedules,
            older_than_seconds=None if older_than_days is None else older_than_days * 86400.0,
            dry_run=dry_run,
        )
    verb = "would delete" if dry_run else "deleted"
    typer.echo(
        f"{verb} {report.profiles} profiles, {report.schedules} schedules, "
        f"{report.solver_runs} solver runs, {report.training_runs} training runs"
    )


@app.command()
def upgrade(
    db: DbOption = None,
    backup_done: Annotated[
        bool,
        typer.Option(
            "--backup-done",
            help="A server database (PostgreSQL): you have backed it up yourself (pg_dump).",
        ),
    ] = False,
) -> None:
    """Migrate the database to this version's schema, after a backup copy of an SQLite file.

    The one way to migrate: other commands and the inspector refuse an older database and name
    this command. A current database is left untouched.
    """
    from ..profiles_db.database import default_database_url
    from ..profiles_db.upgrade import upgrade_database

    try:
        result = upgrade_database(
            db if db is not None else default_database_url(), backup_done=backup_done
        )
    except DatabaseError as e:
        _fail(str(e))
    if not result.migrated:
        typer.echo(
            f"{result.where} is current (schema revision {result.to_revision}): nothing to do"
        )
        return
    copy = f"; the old file is copied to {result.backup}" if result.backup else ""
    typer.echo(
        f"upgraded {result.where} from schema revision {result.from_revision} to "
        f"{result.to_revision}{copy}"
    )


__all__ = ["app"]
