"""The strategy's own per-step metrics (``optpipe/...``), logged only when Lightning would not
hold them otherwise.

A value logged with ``on_step=True, on_epoch=False`` stays in Lightning's result collection
(what loggers write every ``log_every_n_steps`` and what ``callback_metrics`` shows) until the
collection is reset (an epoch's end, a new trainer call). The strategy's metrics change only at
a switch or a calibration, so logging them again on every step (three ``self.log`` calls, each
~0.2 ms of Lightning's bookkeeping) changes nothing anyone sees: ``StepMetrics`` logs them when
a value changed or Lightning no longer holds one of them, and loggers, ``callback_metrics`` and
the progress bar show what they showed when every step logged them.
"""

from __future__ import annotations

from typing import Any


class StepMetrics:
    """``log(module, metrics)`` once per training step; logs only what Lightning lacks."""

    def __init__(self) -> None:
        self._logged: dict[str, float] | None = None
        self.calls = 0  # ``self.log`` calls made (tests count them)

    def log(self, module: Any, metrics: dict[str, float]) -> None:
        if metrics == self._logged and _held(module, metrics):
            return
        for name, value in metrics.items():
            module.log(name, value, on_step=True, on_epoch=False, batch_size=1)
            self.calls += 1
        self._logged = dict(metrics)


def _held(module: Any, metrics: dict[str, float]) -> bool:
    """Whether Lightning's active result collection holds a live value of every name (read
    from its private ``_results``; anything unexpected there reads as not held: log again)."""
    try:
        results = module.trainer._results
        live = {
            metric.meta.name
            for metric in results.values()
            if not getattr(metric, "has_reset", True)
        }
    except Exception:
        return False
    return set(metrics) <= live
