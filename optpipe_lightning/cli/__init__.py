"""The command line ``optpipe``: the commands, their inputs, output and one-line errors.

``app.py`` builds the Typer application (``optpipe = optpipe_lightning.cli:main``);
``schedule_commands.py`` (compare, solve, baseline, simulate, trace), ``problem_commands.py``
(``optpipe problem``) and ``db_commands.py`` (``optpipe db``) hold the commands; ``inputs.py``,
``input_files.py``, ``arguments.py`` and ``size_guard.py`` read and check what the user gives;
``output.py`` and ``solver_run.py`` print; ``records.py`` stores what a command printed
(``--db``); ``errors.py`` and ``command_errors.py`` turn a mistake
into one line; ``demo.py`` builds the demo database of ``optpipe inspect --demo``.
"""

from .app import app, main
from .inputs import user_errors

__all__ = ["app", "main", "user_errors"]
