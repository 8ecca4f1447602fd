"""What a fit writes to its run log step by step (``run_log.py``; global rank 0 holds the log).

Each optimizer step: its wall seconds against the prediction made before it, its batches'
metrics (``BatchMetrics``) and, on GPU, every rank's peak memory (gathered every
``PEAKS_EVERY`` steps, not per step: a gather is a collective). Validation losses and the
calibrations go in too. ``Scheduler`` (``scheduling/scheduler.py``) tells ``StepRecords`` what happened;
the other records (switches, the profile, the memory limit) go to ``active`` directly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..planning.options import PipelineOptions
from ..runtime.engine import PipelineEngine
from ..runtime.process_groups import PipelineComm
from .run_log import BatchMetrics, RunLog

PEAKS_EVERY = 16  # GPU: every rank's peak memory per step is gathered this often (not per step)


class StepRecords:
    """The run log of a fit and what it has not written yet; every rank holds one."""

    def __init__(self, comm: PipelineComm, device: torch.device) -> None:
        self.comm = comm
        self.device = device
        self.run_log: RunLog | None = None  # global rank 0's, from ``open``
        self._peaks: dict[int, float] = {}  # GPU: this rank's peak memory per step, not gathered
        self._batches = BatchMetrics()  # this optimizer step's batches, for the run log

    @property
    def active(self) -> RunLog | None:
        """The run log where it records (global rank 0, a database at hand), else None."""
        log = self.run_log
        return log if log is not None and log.active else None

    def open(self, options: PipelineOptions) -> None:
        """Open the run log on global rank 0 (the other ranks keep none)."""
        if self.comm.is_global_zero:
            self.run_log = RunLog(options.database, options.use_database, options.require_database)

    def note_batch(self, loss: float | Tensor | None, samples: int, tokens: int | None) -> None:
        """A training batch of this optimizer step (``BatchMetrics.add``)."""
        self._batches.add(loss, samples, tokens)

    def note_validation(self, step: int, val_loss: float | None) -> None:
        """The loss of a validation run after ``step`` optimizer steps."""
        log = self.active
        if val_loss is not None and log is not None:
            log.record_metrics(step, {"val_loss": val_loss})

    def record_step(
        self,
        step: int,
        wall: float,
        predicted: float | None,
        engine: PipelineEngine | None,
    ) -> None:
        """Optimizer step ``step``: its wall seconds against the prediction made before it."""
        cuda = self.device.type == "cuda"
        metrics = self._batches.take()
        log = self.active
        if log is not None and engine is not None:
            # GPU: every rank's peaks come later (``gather_peaks``); CPU: none
            log.record_step(step, wall, predicted, None if cuda else [])
            log.record_metrics(step, metrics)
        if cuda:  # pragma: no cover - GPU only
            peak = torch.cuda.max_memory_allocated(self.device)
            watch = engine.cursor.memory if engine is not None else None
            if watch is not None:  # profiling resets the allocator's peak at every action
                peak = max(peak, watch.take_peak())
            self._peaks[step] = float(peak)
            torch.cuda.reset_peak_memory_stats(self.device)
            if step % PEAKS_EVERY == 0:
                self.gather_peaks()

    def gather_peaks(self) -> None:  # pragma: no cover - GPU only
        """Every rank's peak memory of the steps since the last gather, to the run log."""
        mine, self._peaks = self._peaks, {}
        parts = self.comm.gather(mine)
        log = self.active
        if log is not None:
            steps = sorted(set().union(*(p.keys() for p in parts)))
            log.fill_peaks({k: [float(p.get(k, 0.0)) for p in parts] for k in steps})

    def record_calibration(self, step: int, record: dict[str, Any], count: int) -> None:
        """A calibration (``Calibrator``'s record, per pipeline step) for an optimizer step of
        ``count`` pipeline steps."""
        log = self.active
        if log is None:
            return
        log.record_calibration(
            step,
            float(record["previous_seconds"]) * count,
            float(record["predicted_seconds"]) * count,
            float(record["measured_seconds"]) * count,
            f"calibrated {record['schedule']} from {record['steps']} steps "
            f"({record['timed_steps']} op-timed), overhead "
            f"{1e3 * record['overhead_seconds']:.3g} ms per action",
        )

    def close(self, status: str, gather_peaks: bool) -> None:
        """Record how the run ended (``gather_peaks``: the last peaks first, a collective)."""
        if gather_peaks:  # pragma: no cover - GPU only
            self.gather_peaks()
        if self.run_log is not None:
            self.run_log.finish(status)
            self.run_log.close()
            self.run_log = None
