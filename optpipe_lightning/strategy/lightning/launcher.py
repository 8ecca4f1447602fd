"""The launch: Lightning's own launchers, after the checks that must fail before any worker starts.

``CheckingLauncher`` wraps the launcher Lightning would use (``_SubprocessScriptLauncher`` for
``start_method="popen"``, as DDP does; ``_MultiProcessingLauncher`` for ``spawn``/``fork``). In
the launching process it checks the sizes (world size, microbatches, the named schedule's shape)
and the model contract (the hook, the layer count), so a mistake is one error in the user's
process, not one per worker with the others waiting.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import Any, Literal, Protocol

import lightning.pytorch as pl
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.plugins.environments.lightning import find_free_network_port

from ..runtime.fork_safety import inherited_objects_frozen
from .private_api import _Launcher, _MultiProcessingLauncher, _SubprocessScriptLauncher

log = logging.getLogger(__name__)


def _port_in_use(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, port))
        except OSError:
            return True
    return False


def free_main_port(env: Any) -> None:
    """Move the rendezvous to a free port when the one Lightning would use is taken.

    For the launches that start their ranks from this process (fork, spawn): Lightning keeps
    the first ``MASTER_PORT`` it picks in ``os.environ`` for every later ``Trainer`` of the
    process. After a run inside this process (a notebook, one device), the rendezvous store of
    that run can still listen there until its last references are collected; the ranks of the
    next run then meet that stale store, read the addresses of ranks that are gone, and fail to
    connect ("Connection refused") or wait for each other for ever. A port nothing listens on
    is kept, whoever set it.
    """
    if not isinstance(env, LightningEnvironment):
        return
    address = env.main_address if env.main_address != "localhost" else "127.0.0.1"
    old = env.main_port
    if not _port_in_use(address, old):
        return
    new = find_free_network_port()
    os.environ["MASTER_PORT"] = str(new)
    env._main_port = new  # read once by Lightning; no public setter
    log.info("optpipe: rendezvous port %d is in use here; using %d", old, new)


def release_finished_world() -> None:
    """Destroy the process group an earlier run left initialized in this process, before
    forking ranks that start a world of their own.

    Lightning leaves the group of a run inside the launching process (one device, a notebook)
    initialized after ``fit``. Forked ranks would inherit it as already initialized -- each
    alone in a world of one, waiting in its first collective on threads it does not have -- and
    it cannot be destroyed in them (its destructor joins those threads). Here, where its threads
    exist, it goes; its last references in reference cycles are collected at once.
    """
    import gc

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    log.info(
        "optpipe: destroying the process group an earlier run left in this process "
        "(the forked ranks start their own)"
    )
    dist.destroy_process_group()
    gc.collect()


def take_returned_tensors(module: Any, state_dict: Any, *args: Any) -> None:
    """Before rank 0's state loads into the launching process's module: tensors rank 0 dropped
    (another rank's layers) are dropped here too (no stale copy stays), and where this module's tensors are on the meta device (built by
    ``configure_model``) the tensors rank 0 brings get storage (on the CPU) and land there."""
    import torch

    from ..runtime.materialize import META

    dropped = {k for k, v in state_dict.items() if isinstance(v, torch.Tensor) and v.is_meta}
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if name in dropped and not t.is_meta:  # trained elsewhere: no stale copy stays here
            swap = torch.empty_like(t, device=META)
            if isinstance(t, torch.nn.Parameter):
                swap = torch.nn.Parameter(swap, requires_grad=t.requires_grad)
            torch.utils.swap_tensors(t, swap)
    for name in dropped:
        del state_dict[name]
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        value = state_dict.get(name)
        if t.is_meta and isinstance(value, torch.Tensor) and value.device != META:
            new = torch.empty_like(t, device="cpu")
            if isinstance(t, torch.nn.Parameter):
                new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
            torch.utils.swap_tensors(t, new)


class LaunchChecks(Protocol):
    """What the launcher asks of the strategy it launches (``OptPipeStrategy``), beside Lightning's
    ``ParallelStrategy``: named here so that this module does not import ``strategy.py``."""

    @property
    def num_nodes(self) -> int: ...

    @property
    def num_processes(self) -> int: ...

    @property
    def total_devices(self) -> int: ...

    def check_sizes(self, world_size: int) -> None: ...

    def precheck_model(self, model: Any, fitting: bool = False) -> Any: ...


class CheckingLauncher(_Launcher):
    """Checks the model contract and sizes in the launching process, then launches."""

    def __init__(
        self,
        strategy: LaunchChecks,
        start_method: Literal["popen", "spawn", "fork", "forkserver"],
    ) -> None:
        assert isinstance(strategy, pl.strategies.ParallelStrategy)
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
            release_finished_world()
        if self.start_method != "popen":  # rank 0 hosts the rendezvous store on this machine
            free_main_port(self.strategy.cluster_environment)
        hook = None
        if self.start_method != "popen" and isinstance(model, pl.LightningModule):
            # a sharded model: this process's module takes what rank 0 returns (its layers)
            hook = model.register_load_state_dict_pre_hook(take_returned_tensors)
        try:
            if self.start_method == "fork":
                # the forked ranks must never collect this process's objects (``fork_safety``)
                with inherited_objects_frozen():
                    return self.inner.launch(function, *args, trainer=trainer, **kwargs)
            return self.inner.launch(function, *args, trainer=trainer, **kwargs)
        finally:
            if hook is not None:
                hook.remove()

    def kill(self, signum: Any) -> None:  # pragma: no cover - signal path
        kill = getattr(self.inner, "kill", None)
        if kill is not None:
            kill(signum)
