"""The Lightning strategy: model contract, partitioning, the pipeline engine over
torch.distributed.pipelining, activation offload, profiling and online re-solve.

Importing this package imports torch; ``optpipe_lightning`` itself only registers the strategy
when Lightning is installed. Without the ``train`` extra, importing it raises one
``ModuleNotFoundError`` line naming the extra to install.
"""

_TRAIN_EXTRA = "pip install 'optpipe-lightning[train]'"

try:
    import torch as _torch  # noqa: F401
except ImportError as _e:
    raise ModuleNotFoundError(
        f"optpipe_lightning.strategy needs torch, which is not installed: {_TRAIN_EXTRA}",
        name="torch",
    ) from None

from .lightning import namespaces as _namespaces  # noqa: E402 (after the torch check)
from .planning.partition import PartitionError, balanced_partition  # noqa: E402 (after the torch check)
from .planning.planner import NoScheduleError  # noqa: E402 (after the torch check)
from .runtime.contract import ContractError, LayerChain, PipelineSpec, get_spec  # noqa: E402 (after the torch check)
from .runtime.engine import PipelineEngine, ScheduleRejectedError  # noqa: E402 (after the torch check)
from .runtime.hf import causal_lm_layers  # noqa: E402 (imports no transformers)

# optpipe_lightning.strategy.pytorch_lightning: the same strategy, for pytorch_lightning
_namespaces.install()

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
    "causal_lm_layers",
    "get_spec",
]


def __getattr__(name: str) -> object:
    # the Lightning strategy is imported on first use (Lightning is an optional dependency)
    if name in ("OptPipeStrategy", "OptPipeConfigError", "PipelineStepError"):
        try:
            import lightning.pytorch  # noqa: F401
        except ImportError:
            raise ModuleNotFoundError(
                f"optpipe's {name} needs Lightning (lightning.pytorch), which is not installed: "
                f"{_TRAIN_EXTRA} (with pytorch_lightning: "
                f"from optpipe_lightning.strategy.pytorch_lightning import {name})",
                name="lightning",
            ) from None
        from .lightning import strategy

        return getattr(strategy, name)
    raise AttributeError(name)
