"""What each rank holds of the model, and its checkpoints: ``OptPipeStrategy``'s base.

- Building: ``configure_model`` runs on the meta device (``tensor_init_context``); in ``setup``
  each rank materialises its own layers with one device's initial weights and drops the others
  (``own_layers``; ``runtime/materialize.py``).
- Checkpoints: sharded, one DCP shard per rank (``runtime/sharded_checkpoint.py``), or one file
  with the model collected (``runtime/checkpoint.py``); both load after ``setup``, into the
  layers each rank holds, so a run resumes on another schedule, partition or stage count.
- The end: a module with dropped layers leaves them on the meta device (``sharded_teardown``).
"""

from __future__ import annotations

import shutil
from collections.abc import Generator, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies.parallel import ParallelStrategy
from torch import Tensor
from torch.optim import Optimizer

from ..planning.options import OptPipeConfigError, PipelineOptions
from ..runtime.checkpoint import full_state_dict, load_optimizer_states, merged_optimizer_state
from ..runtime.contract import PipelineSpec
from ..runtime.materialize import (
    drop_layers,
    has_meta_tensors,
    layer_owners,
    materialise,
    move_held,
)
from ..runtime.process_groups import PipelineComm
from ..runtime.sharded_checkpoint import (
    is_sharded,
    load_sharded,
    local_optimizer_state,
    save_sharded,
)
from ..scheduling.scheduler import Scheduler

CheckpointFormat = Literal["auto", "sharded", "full"]


class ModelStateStrategy(ParallelStrategy):
    """The model state per rank and its checkpoints (the options: ``OptPipeStrategy``)."""

    options: PipelineOptions
    comm: PipelineComm | None
    scheduler: Scheduler | None

    def init_model_state(
        self,
        shard_model: bool | Literal["auto"],
        checkpoint_format: CheckpointFormat,
        full_model_after_fit: bool | None,
    ) -> None:
        if checkpoint_format not in ("auto", "sharded", "full"):
            raise OptPipeConfigError(
                f"checkpoint_format={checkpoint_format!r}: use 'auto', 'sharded' or 'full'"
            )
        self.shard_model_option = shard_model
        self.checkpoint_format = checkpoint_format
        self.full_model_after_fit = full_model_after_fit
        self.sharded = False  # this run holds only its own layers (decided in ``setup``)
        self._loaded_in_place = False  # the last checkpoint loaded went straight into the model

    @property
    def num_stages(self) -> int:
        raise NotImplementedError

    # ---- building ----------------------------------------------------------------------------

    def own_layers(
        self, module: pl.LightningModule, spec: PipelineSpec, partition: list[int]
    ) -> None:
        """A module built on the meta device gets its own layers materialised (the others
        initialised and dropped, for one device's weights); a sharded module drops the others."""
        meta = has_meta_tensors(module)
        option = self.shard_model_option
        self.sharded = meta if option == "auto" else bool(option)
        if not (meta or self.sharded):
            return
        assert self.comm is not None
        v, placement = self.options.chunks
        owners = layer_owners(len(spec.layers), partition, self.num_stages, v, placement)
        keep = {i for i, o in enumerate(owners) if o == self.comm.pp_rank}
        if not self.sharded:
            keep = set(range(len(spec.layers)))  # asked to hold the whole model
        if meta:
            materialise(module, spec.layers, keep, self.root_device)
        drop_layers(spec.layers, keep)

    @contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Generator[None, None, None]:
        """Lightning's ``configure_model`` call (the module is connected) and
        ``trainer.init_module(empty_init=True)`` build on the meta device; each rank materialises
        its own layers in ``setup``. ``trainer.init_module()`` builds real tensors (weights a
        user loads into them right after are kept)."""
        meta = empty_init is True or (empty_init is None and self.lightning_module is not None)
        if not meta:
            with super().tensor_init_context(empty_init):
                yield
            return
        with torch.device("meta"), self.precision_plugin.tensor_init_context():
            yield

    @property
    def sharded_checkpoints(self) -> bool:
        if self.checkpoint_format == "auto":
            return self.sharded
        return self.checkpoint_format == "sharded"

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """Checkpoints load into the layers ``setup`` materialised on each rank."""
        return True

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The full model, every layer from the rank that trains it (collected on every rank);
        sharded checkpoints: this rank's own tensors only."""
        assert self.lightning_module is not None
        if self.sharded_checkpoints:
            return {
                k: v
                for k, v in self.lightning_module.state_dict().items()
                if not (isinstance(v, Tensor) and v.is_meta)
            }
        engine = self.scheduler.engine if self.scheduler is not None else None
        return full_state_dict(self.lightning_module, engine, self.comm)

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The optimizer state of all stages merged (parameter indices agree on every rank);
        sharded checkpoints: this rank's share, by parameter name."""
        if self.sharded_checkpoints:
            assert self.lightning_module is not None
            return local_optimizer_state(optimizer, self.lightning_module)
        engine = self.scheduler.engine if self.scheduler is not None else None
        return merged_optimizer_state(optimizer, engine, self.comm)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        """Sharded: a directory, one DCP shard per rank (every rank writes); full: one file
        (global rank 0). Both record the schedule, partition and chunking under ``optpipe``."""
        checkpoint["optpipe"] = self._layout()
        if not self.sharded_checkpoints:
            if Path(filepath).is_dir() and self.is_global_zero:
                shutil.rmtree(filepath)  # a sharded checkpoint there before
            super().save_checkpoint(checkpoint, filepath, storage_options)
            return
        if storage_options is not None:
            raise TypeError("OptPipeStrategy's sharded checkpoints take no storage_options")
        path = Path(self.broadcast(str(filepath)))
        if self.is_global_zero:
            if path.is_file():
                path.unlink()
            path.mkdir(parents=True, exist_ok=True)
        self.barrier()
        save_sharded(checkpoint, path, self.is_global_zero)
        self.barrier()

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> Any:
        """A sharded checkpoint loads straight into this rank's layers and optimizer state
        (by name: any partition, schedule or stage count wrote it); a file, as usual."""
        self._loaded_in_place = False
        path = Path(self.broadcast(str(checkpoint_path)))
        if not path.is_dir():
            return super().load_checkpoint(checkpoint_path, weights_only)
        if not is_sharded(path):
            raise OptPipeConfigError(
                f"checkpoint {path} is a directory without a sharded checkpoint's .metadata and "
                "meta.pt: give the directory trainer.save_checkpoint wrote, or a .ckpt file"
            )
        module = self.lightning_module
        assert module is not None
        trainer = module.trainer
        optimizers = self.optimizers if trainer.state.fn == "fit" else []
        meta = load_sharded(
            path, module, optimizers, self.root_device, strict=module.strict_loading
        )
        self._loaded_in_place = True
        meta["state_dict"] = {}
        meta.setdefault("optimizer_states", [{} for _ in optimizers])
        return meta

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        if self._loaded_in_place:
            return
        assert self.lightning_module is not None
        state = checkpoint["state_dict"]
        if self.sharded:  # a whole-model file: each rank takes its own tensors
            own = self.lightning_module.state_dict()
            state = {k: v for k, v in state.items() if not (k in own and own[k].is_meta)}
            self.lightning_module.load_state_dict(state, strict=False)
            return
        self.lightning_module.load_state_dict(state, strict=strict)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        if self._loaded_in_place:
            return
        load_optimizer_states(self.optimizers, checkpoint["optimizer_states"], self.root_device)

    def _layout(self) -> dict[str, Any]:
        """The schedule, partition and chunking of this run (informative: a checkpoint resumes
        on any)."""
        sched = self.scheduler
        engine = sched.engine if sched is not None else None
        return {
            "num_stages": self.num_stages,
            "data_parallel": self.options.data_parallel,
            "partition": None if sched is None else list(sched.partition),
            "num_chunks": None if sched is None else sched.num_chunks,
            "placement": None if sched is None else sched.placement,
            "schedule": None if engine is None else engine.schedule.generator,
            "sharded": self.sharded_checkpoints,
        }

    # ---- the end -----------------------------------------------------------------------------

    @property
    def whole_model_after_fit(self) -> bool:
        """Whether ``fit`` ends with the whole trained model in every rank's module."""
        if self.full_model_after_fit is None:
            return not self.sharded
        return self.full_model_after_fit

    @contextmanager
    def sharded_teardown(self, module: pl.LightningModule | None) -> Iterator[None]:
        """Lightning's teardown moves the module to the CPU: a module with dropped (meta)
        tensors moves the ones it holds, the others stay where they are."""
        if module is None or not has_meta_tensors(module):
            yield
            return
        move_held(module, torch.device("cpu"))
        module.cpu = lambda: module  # type: ignore[method-assign]
        try:
            yield
        finally:
            del module.cpu
