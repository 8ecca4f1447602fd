"""The strategy in both Lightning namespaces: ``lightning.pytorch`` and ``pytorch_lightning``.

Lightning ships its trainer twice: ``lightning.pytorch`` (package ``lightning``) and
``pytorch_lightning`` (package ``pytorch-lightning``), the second made from the same sources by
rewriting ``lightning.pytorch`` to ``pytorch_lightning`` and ``lightning.fabric`` to
``lightning_fabric``. A Trainer accepts only strategies derived from its own namespace's classes,
so one class cannot serve both.

This room (``strategy/lightning/``) is written against ``lightning.pytorch``. For
``pytorch_lightning`` the finder installed here serves the same files as the package
``optpipe_lightning.strategy.pytorch_lightning`` with those two names rewritten the way Lightning
rewrites its own sources, within each line (tracebacks point at the real lines). The rooms below
(scheduling, records, runtime, planning) never import Lightning and are shared by both.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).parent
MIRROR = "optpipe_lightning.strategy.pytorch_lightning"
_NAMES = re.compile(r"(?<![\w.])lightning\.(pytorch|fabric)\b")


def classic_source(text: str) -> str:
    """``text`` with ``lightning.pytorch`` / ``lightning.fabric`` as ``pytorch_lightning`` /
    ``lightning_fabric`` (the rewrite that makes the ``pytorch-lightning`` package)."""
    return _NAMES.sub(
        lambda m: "pytorch_lightning" if m[1] == "pytorch" else "lightning_fabric", text
    )


class _ClassicLoader(importlib.abc.SourceLoader):
    def __init__(self, path: Path) -> None:
        self.path = path

    def get_filename(self, fullname: str) -> str:
        return str(self.path)

    def get_data(self, path: str) -> bytes:
        # no path_stats: never a bytecode cache (it would collide with the real module's)
        return classic_source(Path(path).read_text(encoding="utf-8")).encode("utf-8")


class _ClassicFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == MIRROR:
            file, package = HERE / "__init__.py", True
        elif fullname.startswith(MIRROR + ".") and "." not in fullname[len(MIRROR) + 1 :]:
            file, package = HERE / f"{fullname[len(MIRROR) + 1 :]}.py", False
            if not file.is_file():
                return None
        else:
            return None
        # a spec of our own: spec_from_file_location would give the package this directory as
        # __path__, and the path finder would then load the unrewritten files
        spec = importlib.machinery.ModuleSpec(
            fullname, _ClassicLoader(file), origin=str(file), is_package=package
        )
        spec.has_location = True
        return spec


def install() -> None:
    """Make ``optpipe_lightning.strategy.pytorch_lightning`` importable (idempotent)."""
    if not any(isinstance(f, _ClassicFinder) for f in sys.meta_path):
        sys.meta_path.append(_ClassicFinder())
