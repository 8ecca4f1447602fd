"""The strategy's collectives, refused inside a module step: ``OptPipeStrategy``'s base.

Under ``OptPipeStrategy`` a module's ``training_step`` (and validation/test/predict steps) runs on
the last pipeline stage alone, once per microbatch; a collective called there (``barrier``,
``broadcast``, ``reduce``, ``all_gather``, e.g. through ``self.log(..., sync_dist=True)`` inside the
pipeline or ``self.all_gather``) would wait for ranks that never call it. ``guard`` is switched on
around each module step (``step.PipelinedSteps``); a collective then raises ``PipelineStepError``
with the fix instead of hanging.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from lightning.fabric.utilities.distributed import group as _group
from torch import Tensor

from .model_state import ModelStateStrategy
from .module_steps import PipelineStepError
from .private_api import _distributed_is_initialized, _sync_ddp_if_available


class StepCollectives(ModelStateStrategy):
    """Lightning's collectives over the whole world, each refused while a module step runs."""

    _in_step: bool = False  # a module step runs on this rank alone (no collectives)

    def _guard(self, on: bool) -> None:
        self._in_step = on

    def _refuse_in_step(self, what: str) -> None:
        if self._in_step:
            raise PipelineStepError(
                f"a step called {what}, a collective: under OptPipeStrategy a step runs on the "
                "last pipeline stage alone; log with self.log(..., sync_dist=True) instead"
            )

    def barrier(self, name: str | None = None) -> None:
        self._refuse_in_step("barrier")
        if _distributed_is_initialized():
            if dist.get_backend() == "nccl":  # pragma: no cover - GPU only
                dist.barrier(device_ids=[self.root_device.index])
            else:
                dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        self._refuse_in_step("broadcast")
        if not _distributed_is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src, group=_group.WORLD)
        return box[0]

    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any | None = "mean") -> Any:
        self._refuse_in_step("reduce")
        if isinstance(tensor, Tensor):
            return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op)
        return tensor

    def all_gather(
        self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False
    ) -> Tensor:
        self._refuse_in_step("all_gather")
        return super().all_gather(tensor, group, sync_grads)
