"""optpipe-lightning: memory-aware pipeline-parallel training."""

import importlib.util as _ilu
import sys as _sys
from importlib.metadata import PackageNotFoundError as _NotInstalled
from importlib.metadata import version as _version

try:
    __version__: str = _version("optpipe-lightning")
except _NotInstalled:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"


# Lightning's two namespaces -> the package serving optpipe's strategy for each
# (strategy/lightning/namespaces.py: the same files, for pytorch_lightning)
_FACES = {
    "lightning.pytorch": "optpipe_lightning.strategy.lightning",
    "pytorch_lightning": "optpipe_lightning.strategy.pytorch_lightning",
}


def _register_strategy(namespace: str = "lightning.pytorch") -> None:
    """Register "optpipe" in that namespace's StrategyRegistry (never fails the import)."""
    face = _FACES[namespace]
    if f"{face}.strategy" in _sys.modules:
        return  # that module registers the strategy itself when its import completes
    if any(
        name.startswith(f"{face}.")
        and getattr(getattr(m, "__spec__", None), "_initializing", False)
        for name, m in list(_sys.modules.items())
    ):
        return  # a module of the face is importing Lightning: registering now would be circular
    try:
        import importlib

        importlib.import_module(".strategy", "optpipe_lightning")  # installs the second face
        importlib.import_module(f"{face}.registration").register()
    except Exception as e:  # pragma: no cover - a broken torch/Lightning must not break import
        import warnings

        warnings.warn(f"optpipe: strategy not registered with {namespace}: {e}", stacklevel=2)


class _AfterLightningImport:
    """Meta-path finder: registers the strategy once a Lightning namespace finishes importing."""

    def __init__(self, targets: set[str]) -> None:
        self.targets = targets

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.targets:
            return None
        self.targets.discard(fullname)
        if not self.targets:
            _sys.meta_path.remove(self)
        # find the real spec with this finder out of the way (it may still be on sys.meta_path)
        spec = _ilu.find_spec(fullname) if self not in _sys.meta_path else self._find_past(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            _register_strategy(fullname)

        loader.exec_module = exec_and_register  # type: ignore[method-assign]
        return spec

    def _find_past(self, fullname):
        _sys.meta_path.remove(self)
        try:
            return _ilu.find_spec(fullname)
        finally:
            _sys.meta_path.insert(0, self)


_pending = set()
for _namespace, _top in (("lightning.pytorch", "lightning"), ("pytorch_lightning", None)):
    if _namespace in _sys.modules:
        _register_strategy(_namespace)
    elif _ilu.find_spec(_top or _namespace) is not None:
        _pending.add(_namespace)
if _pending:
    # lazily: importing optpipe_lightning alone does not import torch or Lightning
    _sys.meta_path.insert(0, _AfterLightningImport(_pending))
