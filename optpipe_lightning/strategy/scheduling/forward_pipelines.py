"""Validation, test and predict: forward-only pipelines of their own, one per microbatch count
and input shape, the last few kept (``MAX_FORWARD_PIPELINES``). A change of the layer groups
(re-partition, re-chunk) drops them: they are built again on the new layout when next needed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...schedule import Problem
from ..planning.options import PipelineOptions
from ..runtime.contract import PipelineSpec
from ..runtime.engine import ForwardPipeline
from ..runtime.microbatch import eval_microbatches
from ..runtime.process_groups import PipelineComm

MAX_FORWARD_PIPELINES = 4  # forward-only pipelines kept (one per microbatch count and shape)


class ForwardPipelines:
    """The forward-only pipelines of this rank, most recently used last."""

    def __init__(self, spec: PipelineSpec, comm: PipelineComm, device: torch.device) -> None:
        self.spec = spec
        self.comm = comm
        self.device = device
        self._pipes: OrderedDict[Any, ForwardPipeline] = OrderedDict()

    def microbatches(self, options: PipelineOptions, training: int | None, batch_size: int) -> int:
        """The microbatch count of a forward-only batch (``training``'s or the one asked for
        when it divides the batch, else chosen as ``"auto"`` would; a batch smaller than the
        pipeline runs as that many microbatches)."""
        requested = options.num_microbatches
        m = requested if isinstance(requested, int) else training
        return eval_microbatches(batch_size, self.comm.num_stages, m)

    def __contains__(self, key: tuple[int, Any]) -> bool:
        return key in self._pipes

    def get(
        self,
        key: tuple[int, Any],
        shape: Callable[[int], Problem],
        partition: Sequence[int],
    ) -> ForwardPipeline:
        """The pipeline for ``key`` (microbatch count, input shape); one not kept is built on
        ``partition`` and ``shape(count)``, the pipeline's problem at that microbatch count."""
        pipe = self._pipes.get(key)
        if pipe is None:
            pipe = ForwardPipeline(
                list(self.spec.layers),
                shape(key[0]),
                list(partition),
                self.comm.pp_rank,
                self.comm.pp_group,
                self.device,
            )
            self._pipes[key] = pipe
            while len(self._pipes) > MAX_FORWARD_PIPELINES:
                self._pipes.popitem(last=False)
        self._pipes.move_to_end(key)
        return pipe

    def clear(self) -> None:
        self._pipes.clear()
