"""Registers ``"optpipe"`` (and ``"optpipe_spawn"``, ``"optpipe_fork"``) in Lightning's registry.

Imported by ``optpipe_lightning/__init__.py`` only when Lightning is installed.
"""

from __future__ import annotations


def register() -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    from .strategy import OptPipeStrategy

    OptPipeStrategy.register_strategies(StrategyRegistry)
