"""The ``optpipe`` command: solve, compare, simulate, build problems, export traces, inspect.

Exit code 0 on success, 2 on bad input with a one-line reason on stderr (never a traceback for a
user's mistake). ``--json`` output follows the contracts in DESIGN.md.

This module is the app: it puts the schedule commands (``schedule_commands.py``: compare, solve,
baseline, simulate, trace) on it, holds ``inspect``, and mounts ``db`` (``cli/db_commands.py``)
and ``problem`` (``cli/problem_commands.py``). What the commands share: ``cli/inputs.py`` (files, options,
``user_errors``), ``cli/output.py`` (rows, tables, consoles), ``cli/solver_run.py`` (a solve
with its progress display and database record).
"""

from __future__ import annotations

from typing import Annotated

import typer

from .command_errors import OneLineErrors
from .errors import UserError
from .inputs import user_errors
from .output import err
from .schedule_commands import baseline, compare, simulate_cmd, solve, trace

app = typer.Typer(
    name="optpipe",
    help="Memory-aware pipeline schedules: solve, compare, simulate, export, inspect.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=OneLineErrors,
)


def _print_version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        typer.echo(f"optpipe-lightning {version('optpipe-lightning')}")
    except PackageNotFoundError:  # a source tree that was never installed
        typer.echo("optpipe-lightning (not installed: unknown version)")
    raise typer.Exit(0)


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Memory-aware pipeline schedules: solve, compare, simulate, export, inspect."""


# the schedule commands (schedule_commands.py), in the order --help lists them
app.command()(compare)
app.command()(solve)
app.command()(baseline)
app.command(name="simulate")(simulate_cmd)
app.command()(trace)


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
            from ..inspector.launch import run_inspector
        except ImportError as e:
            raise UserError(
                f"the inspector needs its extra: pip install 'optpipe-lightning[inspector]' ({e})"
            ) from None
        if demo:
            from .demo import ensure_demo_database

            db = ensure_demo_database(db, log=lambda m: err.print(f"optpipe inspect: {m}"))
        raise typer.Exit(run_inspector(db, port))


def _mount_optional() -> None:
    from importlib.util import find_spec

    if find_spec("sqlalchemy") is None:  # the database extra is not installed
        return
    from .db_commands import app as db_app  # (imports no SQLAlchemy until a command runs)

    app.add_typer(db_app, name="db", help="List, show, export, import and prune the database.")


def _mount_problem() -> None:
    try:
        from .problem_commands import problem_command
    except ImportError:
        return
    app.command(name="problem")(problem_command)


_mount_optional()
_mount_problem()


def main() -> None:
    app(prog_name="optpipe")  # (also under `python -m optpipe_lightning`)


if __name__ == "__main__":
    main()
