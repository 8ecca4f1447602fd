"""optpipe-lightning: memory-aware pipeline-parallel training."""

import importlib.util as _ilu
import sys as _sys


def _register_strategy() -> None:
    """Register "optpipe" in Lightning's StrategyRegistry (never fails the import)."""
    if "optpipe_lightning.strategy.lightning.strategy" in _sys.modules:
        return  # that module registers the strategy itself when its import completes
    try:
        from .strategy.lightning.registration import register

        register()
    except Exception as e:  # pragma: no cover - a broken torch/Lightning must not break import
        import warnings

        warnings.warn(f"optpipe: strategy not registered with Lightning: {e}", stacklevel=2)


class _AfterLightningImport:
    """Meta-path finder: registers the strategy once ``lightning.pytorch`` finishes importing."""

    target = "lightning.pytorch"

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.target:
            return None
        _sys.meta_path.remove(self)
        spec = _ilu.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            _register_strategy()

        loader.exec_module = exec_and_register  # type: ignore[method-assign]
        return spec


if "lightning.pytorch" in _sys.modules:
    _register_strategy()
elif _ilu.find_spec("lightning") is not None:
    # lazily: importing optpipe_lightning alone does not import torch or Lightning
    _sys.meta_path.insert(0, _AfterLightningImport())
