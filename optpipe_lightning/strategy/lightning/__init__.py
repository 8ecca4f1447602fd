"""The Lightning face: ``OptPipeStrategy``, its launcher, its registration and the training step.

Imports the rooms below it (``scheduling``, ``records``, ``runtime``, ``planning``); none imports it.
"""

_PUBLIC = ("OptPipeStrategy", "OptPipeConfigError", "PipelineStepError")


def __getattr__(name: str) -> object:
    # ``optpipe_lightning.strategy.lightning.OptPipeStrategy`` (lightning.pytorch) and, served
    # from the same files, ``optpipe_lightning.strategy.pytorch_lightning.OptPipeStrategy``
    if name in _PUBLIC:
        from . import strategy

        return getattr(strategy, name)
    raise AttributeError(name)
