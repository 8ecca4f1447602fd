"""The Lightning strategy: model contract, partitioning, the pipeline engine over
torch.distributed.pipelining, activation offload, profiling and online re-solve.

Importing this package imports torch; ``optpipe_lightning`` itself only registers the strategy
when Lightning is installed.
"""

from .planning.partition import PartitionError, balanced_partition
from .planning.planner import NoScheduleError
from .runtime.contract import ContractError, LayerChain, PipelineSpec, get_spec
from .runtime.engine import PipelineEngine, ScheduleRejectedError

__all__ = [
    "ContractError",
    "LayerChain",
    "NoScheduleError",
    "OptPipeConfigError",
    "OptPipeStrategy",
    "PartitionError",
    "PipelineEngine",
    "PipelineSpec",
    "PipelineStepError",
    "ScheduleRejectedError",
    "balanced_partition",
    "get_spec",
]


def __getattr__(name: str) -> object:
    # the Lightning strategy is imported on first use (Lightning is an optional dependency)
    if name in ("OptPipeStrategy", "OptPipeConfigError", "PipelineStepError"):
        from .lightning import strategy

        return getattr(strategy, name)
    raise AttributeError(name)
