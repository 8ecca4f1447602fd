"""What each op leaves allocated, read from the CUDA caching allocator while profiling.

torch's split backward does not follow the memory model of the Zero Bubble paper (B frees part of
the activation): its input-gradient pass keeps the whole graph (``retain_graph``) *and* allocates
the intermediate gradients its weight-gradient pass needs, which W frees (measured on an H200:
B leaves +0.69 of the activation, W frees 1.69 of it). So the profile carries what the allocator
measured instead of a rule.

``OpMemoryWatch`` cuts a profiling step into windows, one per compute action of this rank: from
the action's start to the next action's start (the last one to the end of the step), so that
what the runtime does between actions is charged to the action it follows (the loss after the
last stage's F, torch's hand-over of an output or a gradient, a receive buffer). Per window it
records

- the change of ``memory_allocated`` (what the op leaves allocated), and
- how far ``max_memory_allocated`` rose above both ends of the window (the op's transient:
  kernel workspace, temporaries freed before the next op), the peak statistic being reset at
  every window's start.

Allocator statistics follow the host's issue order (the caching allocator accounts a block when
the host allocates or frees it), so no synchronization is needed: a window costs three host
calls. The allocator is injectable (``Allocator``) so that tests can drive a watch with a made-up
sequence of readings; on CPU there is no allocator counter and no watch (the profile keeps the
rule-based memory model there).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from ...schedule.profile import OpMemory, Profile


class Allocator(Protocol):
    """The three allocator readings a watch needs (bytes)."""

    def allocated(self) -> int: ...

    def peak(self) -> int: ...

    def reset_peak(self) -> None: ...


class CudaAllocator:
    """``torch.cuda``'s caching-allocator statistics of one device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def allocated(self) -> int:  # pragma: no cover - GPU only
        return int(torch.cuda.memory_allocated(self.device))

    def peak(self) -> int:  # pragma: no cover - GPU only
        return int(torch.cuda.max_memory_allocated(self.device))

    def reset_peak(self) -> None:  # pragma: no cover - GPU only
        torch.cuda.reset_peak_memory_stats(self.device)


Sample = tuple[int, int]  # (bytes left allocated, transient bytes above both ends)


class OpMemoryWatch:
    """Per (op, chunk): every window's (left allocated, transient) sample (module doc)."""

    def __init__(self, allocator: Allocator) -> None:
        self.allocator = allocator
        self.samples: dict[tuple[str, int], list[Sample]] = defaultdict(list)
        self._open: tuple[str, int, int] | None = None  # (op, chunk, allocated at its start)
        self._peak_seen = 0
        # when a list: every window in order, (op, chunk, allocated at its start, left, transient)
        self.trace: list[tuple[str, int, int, int, int]] | None = None

    def begin(self, op: str, chunk: int) -> None:
        """An action starts: the previous window ends here, this one opens."""
        self.close()
        start = self.allocator.allocated()
        self.allocator.reset_peak()
        self._open = (op, chunk, start)

    def close(self) -> None:
        """End the open window (at the next action's start or the end of the step)."""
        if self._open is None:
            return
        op, chunk, start = self._open
        self._open = None
        now = self.allocator.allocated()
        peak = max(self.allocator.peak(), start, now)
        self._peak_seen = max(self._peak_seen, peak)
        sample = (now - start, peak - max(start, now))
        self.samples[(op, chunk)].append(sample)
        if self.trace is not None:
            self.trace.append((op, chunk, start, *sample))

    def discard(self) -> None:
        """Drop the open window (a step that did not finish)."""
        self._open = None

    def clear(self) -> None:
        """Forget every sample (a warm-up step's)."""
        self.samples.clear()

    def take_peak(self) -> int:
        """The highest ``max_memory_allocated`` the windows saw since the last call: the watch
        resets the allocator's peak at every action, so a step's peak is this (or the
        allocator's own reading since the last action, whichever is higher)."""
        p, self._peak_seen = self._peak_seen, 0
        return p

    def chunk_samples(self, chunk: int) -> dict[str, list[Sample]]:
        """This chunk's samples by op kind (``"F"``, ``"B"``, ``"W"``, ``"BW"``)."""
        return {op: list(v) for (op, c), v in self.samples.items() if c == chunk and v}


def summarize(samples: Mapping[str, Sequence[Sample]]) -> OpMemory | None:
    """The profile's memory of one (stage, chunk): the median bytes F, B, W (and fused BW) left
    allocated, and the largest transient of any of its ops. None without F, B and W samples
    (then the profile's rule stands)."""
    if not all(samples.get(op) for op in ("F", "B", "W")):
        return None

    def median(op: str) -> float:
        return float(statistics.median(d for d, _ in samples[op]))

    bw = samples.get("BW")
    return OpMemory(
        f=median("F"),
        b=median("B"),
        w=median("W"),
        bw=median("BW") if bw else None,
        transient=float(max(t for v in samples.values() for _, t in v)),
        samples=min(len(samples[op]) for op in ("F", "B", "W")),
    )


def limits_less_reserve(limits: Sequence[float], profile: Profile) -> list[float]:
    """The activation limits the solver gets under ``memory_limit="auto"``: each stage's limit
    less the bytes the memory model does not see (``Profile.memory_reserve``: the largest
    transient of the stage's ops, which include torch's hand-over of outputs and gradients and
    the loss). At least 1 byte (the planner then says that nothing fits)."""
    reserve = profile.memory_reserve()
    return [
        max(float(lim) - (reserve[s] if s < len(reserve) else 0.0), 1.0)
        for s, lim in enumerate(limits)
    ]
