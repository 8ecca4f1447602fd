"""The launch: Lightning's own launchers, after the checks that must fail before any worker starts.

``CheckingLauncher`` wraps the launcher Lightning would use (``_SubprocessScriptLauncher`` for
``start_method="popen"``, as DDP does; ``_MultiProcessingLauncher`` for ``spawn``/``fork``). In
the launching process it checks the sizes (world size, microbatches, the named schedule's shape)
and the model contract (the hook, the layer count), so a mistake is one error in the user's
process, not one per worker with the others waiting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.strategies.launchers import (
    _MultiProcessingLauncher,
    _SubprocessScriptLauncher,
)
from lightning.pytorch.strategies.launchers.launcher import _Launcher

from .fork_safety import inherited_objects_frozen

if TYPE_CHECKING:
    from .strategy import OptPipeStrategy


class CheckingLauncher(_Launcher):
    """Checks the model contract and sizes in the launching process, then launches."""

    def __init__(
        self,
        strategy: OptPipeStrategy,
        start_method: Literal["popen", "spawn", "fork", "forkserver"],
    ) -> None:
        self.strategy = strategy
        self.start_method = start_method
        assert strategy.cluster_environment is not None
        self.inner: Any
        if start_method == "popen":
            self.inner = _SubprocessScriptLauncher(
                strategy.cluster_environment, strategy.num_processes, strategy.num_nodes
            )
        else:
            self.inner = _MultiProcessingLauncher(strategy, start_method=start_method)

    @property
    def is_interactive_compatible(self) -> bool:
        return bool(self.inner.is_interactive_compatible)

    def launch(
        self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any
    ) -> Any:
        self.strategy.check_sizes(self.strategy.total_devices)
        model = args[0] if args else None
        if isinstance(model, pl.LightningModule):
            self.strategy.precheck_model(model, fitting=getattr(trainer, "training", False))
        if self.start_method == "fork":
            # the forked ranks must never collect this process's objects (``fork_safety``)
            with inherited_objects_frozen():
                return self.inner.launch(function, *args, trainer=trainer, **kwargs)
        return self.inner.launch(function, *args, trainer=trainer, **kwargs)

    def kill(self, signum: Any) -> None:  # pragma: no cover - signal path
        kill = getattr(self.inner, "kill", None)
        if kill is not None:
            kill(signum)
