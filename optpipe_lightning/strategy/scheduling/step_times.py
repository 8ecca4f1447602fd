"""An optimizer step's time, measured boundary to boundary, and the next one's prediction.

The run log compares like with like: every optimizer step's wall time (boundary to boundary, on
global rank 0) against its prediction: the running schedule's makespan per pipeline step plus
the time outside the pipeline (optimizer update, the training loop), the median of the recent
steps' measured share (``OUTSIDE_WINDOW``). The same times give a background solve its step time
(``step_estimate``) with the steps left (``fit_length``). ``StepTimes`` only keeps the books: the caller reads the clock and passes it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

OUTSIDE_WINDOW = 16  # recent steps whose time outside the pipeline predicts the next one's


class StepTimes:
    """The pipeline steps of the optimizer step in progress and the recent optimizer steps."""

    def __init__(self) -> None:
        self.pipeline_seconds = 0.0  # in the pipeline, this optimizer step so far
        self.pipeline_steps = 0  # pipeline steps in this optimizer step (accumulate_grad_batches)
        self.boundary: float | None = None  # when the last optimizer step ended (perf_counter)
        self.outside: deque[float] = deque(maxlen=OUTSIDE_WINDOW)  # seconds outside the pipeline
        self.walls: deque[float] = deque(maxlen=OUTSIDE_WINDOW)  # the running schedule's steps
        self.count = 1  # pipeline steps in the last optimizer step
        self.predicted_step: float | None = None  # the whole optimizer step's prediction

    def pipeline_step_starts(self, now: float) -> None:
        """A pipeline step starts at ``now`` (the first one starts the first optimizer step)."""
        if self.boundary is None:
            self.boundary = now

    def pipeline_step_took(self, elapsed: float) -> None:
        """The pipeline step took ``elapsed`` seconds."""
        self.pipeline_seconds += elapsed
        self.pipeline_steps += 1

    def end_optimizer_step(self, now: float) -> tuple[float, int]:
        """The optimizer step ended at ``now``: its wall seconds and its pipeline steps."""
        wall = now - (self.boundary if self.boundary is not None else now)
        self.boundary = now
        seconds, self.pipeline_seconds = self.pipeline_seconds, 0.0
        count, self.pipeline_steps = max(self.pipeline_steps, 1), 0
        self.count = count
        self.outside.append(max(0.0, wall - seconds))
        return wall, count

    def outside_seconds(self) -> float:
        """The recent steps' median time outside the pipeline (0 before the first)."""
        return statistics.median(self.outside) if self.outside else 0.0

    def predict_next(self, predicted: float | None, count: int) -> None:
        """The next optimizer step's prediction from the running schedule's makespan
        ``predicted`` (None or 0: no prediction): one pipeline step per accumulated batch (the
        optimizer step takes ``count`` of them) plus the recent time outside the pipeline."""
        if predicted:
            self.predicted_step = predicted * count + self.outside_seconds()
        else:
            self.predicted_step = None

    def step_estimate(self, predicted: float | None, count: int) -> float:
        """An optimizer step's seconds: measured on the running schedule when it ran three
        steps (the first after a switch carries the switch), else predicted."""
        if len(self.walls) >= 3:
            return statistics.median(self.walls)
        return (predicted or 0.0) * count + self.outside_seconds()


def fit_length(module: Any) -> float:
    """The optimizer steps of the whole fit, from the module's trainer (inf: unknown)."""
    total = math.inf
    trainer = getattr(module, "_trainer", None)
    try:
        if trainer is not None:
            total = float(trainer.estimated_stepping_batches)
    except Exception:  # unknown length: count on many steps
        total = math.inf
    return total if total > 0 else math.inf
