"""The one place that imports Lightning's private API (names with a leading underscore).

``strategy.py`` and ``launcher.py`` take these names from here, nowhere else. Each entry of
``PRIVATE_API`` says where the name lives and which parameters we pass it; ``check()`` verifies
them and ``tests/strategy/test_strat_private_api.py`` runs it, so a Lightning release that moves,
renames or re-signs one fails there with one line naming it (and at import here, with the same
line). torch's private pipelining API is wrapped likewise in ``runtime/torch_adapter.py``.

Served for ``pytorch_lightning`` too (``namespaces.py`` rewrites ``lightning.pytorch`` and
``lightning.fabric``). Tested: lightning / pytorch-lightning 2.4.0 (the floor, with torch 2.13.0)
and 2.6.6; the list with versions is in docs/strategy.md, "Private APIs".
"""

from __future__ import annotations

import importlib
import inspect

TESTED = "2.4.0 and 2.6.6"

# (module, name, parameters we pass: each must be in the signature); the order of use:
# the launchers (launcher.py), then the process group and collectives (strategy.py)
PRIVATE_API: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("lightning.pytorch.strategies.launchers.launcher", "_Launcher", ()),
    (
        "lightning.pytorch.strategies.launchers",
        "_SubprocessScriptLauncher",
        ("cluster_environment", "num_processes", "num_nodes"),
    ),
    (
        "lightning.pytorch.strategies.launchers",
        "_MultiProcessingLauncher",
        ("strategy", "start_method"),
    ),
    (
        "lightning.fabric.utilities.distributed",
        "_init_dist_connection",
        ("cluster_environment", "torch_distributed_backend"),
    ),
    ("lightning.fabric.utilities.distributed", "_distributed_is_initialized", ()),
    (
        "lightning.fabric.utilities.distributed",
        "_get_default_process_group_backend_for_device",
        ("device",),
    ),
    (
        "lightning.fabric.utilities.distributed",
        "_sync_ddp_if_available",
        ("result", "group", "reduce_op"),
    ),
)


class UnsupportedLightningError(ImportError):
    """The installed Lightning lacks (or re-signed) a private name optpipe uses."""


def _problem(module: str, name: str, params: tuple[str, ...]) -> str | None:
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return f"{module}.{name} is gone"
    if params:
        target = obj.__init__ if inspect.isclass(obj) else obj
        try:
            have = inspect.signature(target).parameters
        except (TypeError, ValueError):  # pragma: no cover - a builtin
            return None
        missing = [p for p in params if p not in have]
        if missing:
            return f"{module}.{name} no longer takes {', '.join(missing)}"
    return None


def check() -> list[str]:
    """One line per private name that is missing or changed in the installed Lightning."""
    version = getattr(importlib.import_module("lightning.pytorch"), "__version__", "?")
    return [
        f"optpipe: Lightning {version} changed a private API optpipe uses: {p} (tested with "
        f"{TESTED}; install one of those, e.g. pip install 'lightning=={TESTED.split()[-1]}')"
        for p in (_problem(*entry) for entry in PRIVATE_API)
        if p is not None
    ]


_problems = check()
if _problems:
    raise UnsupportedLightningError(_problems[0])


from lightning.fabric.utilities.distributed import (  # noqa: E402 (after the check)
    _distributed_is_initialized,
    _get_default_process_group_backend_for_device,
    _init_dist_connection,
    _sync_ddp_if_available,
)
from lightning.pytorch.strategies.launchers import (  # noqa: E402
    _MultiProcessingLauncher,
    _SubprocessScriptLauncher,
)
from lightning.pytorch.strategies.launchers.launcher import _Launcher  # noqa: E402

__all__ = [
    "PRIVATE_API",
    "TESTED",
    "UnsupportedLightningError",
    "_Launcher",
    "_MultiProcessingLauncher",
    "_SubprocessScriptLauncher",
    "_distributed_is_initialized",
    "_get_default_process_group_backend_for_device",
    "_init_dist_connection",
    "_sync_ddp_if_available",
    "check",
]
