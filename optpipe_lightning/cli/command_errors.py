"""How every ``optpipe`` command fails: one line ``optpipe: error: ...`` on stderr, exit code 2.

``OneLineErrors`` is the click group class of the ``optpipe`` app (and of ``optpipe db`` when it
runs on its own): a mistake in the arguments (an unknown option, a value of the wrong type, a
missing argument) becomes one line naming it and the ``--help`` to read, instead of Typer's
framed usage box. An exception no command turned into a user error is a bug: it prints one line
``optpipe: internal error: ...`` and exits with code 70 (``EX_SOFTWARE``); ``OPTPIPE_DEBUG=1``
shows its traceback instead. Running out of memory is a one-line error with exit code 2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

_UsageErrors: type[Exception]
try:  # typer >= 0.2x vendors click: its usage errors derive from TyperException
    from typer import TyperException as _UsageErrors
except ImportError:  # pragma: no cover (older typer: click's own)
    from click import ClickException as _UsageErrors

PREFIX = "optpipe: error: "
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 70
MAX_MESSAGE = 600


def one_line(message: str) -> str:
    """The message on one line: control characters escaped, at most ``MAX_MESSAGE`` long."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message))
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def print_error(message: str) -> None:
    sys.stderr.write(PREFIX + one_line(message) + "\n")
    sys.stderr.flush()


def fail(message: str) -> NoReturn:
    """Print ``optpipe: error: <message>`` on one line and exit with code 2."""
    print_error(message)
    raise typer.Exit(EXIT_BAD_INPUT)


def _usage_line(e: Exception) -> str:
    format_message = getattr(e, "format_message", None)
    msg = format_message() if callable(format_message) else str(e)
    msg = str(msg).replace(": Value error, ", ": ")  # pydantic's prefix on a choice's error
    ctx = getattr(e, "ctx", None)
    path = getattr(ctx, "command_path", None)
    return f"{msg} (see `{path} --help`)" if path else str(msg)


class OneLineErrors(TyperGroup):
    """A Typer group whose failures are each one line on stderr (see the module doc)."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except typer.Exit:
            raise
        except typer.Abort:
            sys.stderr.write("optpipe: interrupted\n")
            sys.exit(130)
        except _UsageErrors as e:
            if str(e).strip():  # (no arguments at all: the help was printed instead)
                print_error(_usage_line(e))
            sys.exit(EXIT_BAD_INPUT)
        except MemoryError:
            print_error(
                "out of memory: the input is too large for this machine; "
                "try a smaller problem (fewer stages, microbatches or chunks)"
            )
            sys.exit(EXIT_BAD_INPUT)
        except Exception as e:
            if os.environ.get("OPTPIPE_DEBUG"):
                raise
            sys.stderr.write(
                "optpipe: internal error: "
                + one_line(f"{type(e).__name__}: {e}")
                + " (a bug: please report it; OPTPIPE_DEBUG=1 shows the traceback)\n"
            )
            sys.exit(EXIT_INTERNAL)
        sys.exit(code if isinstance(code, int) else 0)
