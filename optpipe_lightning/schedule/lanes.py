"""Copy lanes: which transfers run one at a time (docs/formats.md, "Transfers").

A stage's copy channel (shared by the stages of one ``offload.channel_groups`` entry) has two
lanes when ``offload.duplex`` (the default): OFFLOADs (device to host) run on one, RELOADs (host
to device) on the other, at the same time; each lane runs one transfer at a time. Half duplex
(``duplex: false``): one lane carries both directions. Every part that times or bounds copies
(simulator, bounds, list rules, solver models) takes its lanes from here.
"""

from __future__ import annotations

from .problem import Problem


def is_duplex(problem: Problem) -> bool:
    """Whether offloads and reloads run on separate lanes."""
    return problem.offload is not None and problem.offload.duplex


def stage_lanes(problem: Problem) -> list[tuple[int, int]]:
    """Per stage, ``(lane of its OFFLOADs, lane of its RELOADs)``: the same lane id for stages
    of one channel group, and for both directions unless duplex."""
    duplex = is_duplex(problem)
    return [(2 * ch, 2 * ch + 1 if duplex else 2 * ch) for ch in problem.channel_of()]


def lane_of(problem: Problem, stage: int, op: str) -> int:
    """The lane a transfer (``"OFFLOAD"`` or ``"RELOAD"``) of ``stage`` runs on."""
    off, rel = stage_lanes(problem)[stage]
    return rel if op == "RELOAD" else off


def lane_seconds(problem: Problem, stage: int, chunk: int) -> float:
    """The most time one offloaded activation of (stage, chunk) keeps any one lane busy: its
    offload plus its reload on one lane, the longer of the two with duplex. Every activation's
    copies are in the same proportion (bytes over one bandwidth each way), so with duplex the
    busier lane is the same one for all of them, and "the copies fit in T on each lane" is "the
    sum of these fits in T"."""
    off, rel = problem.offload_time(stage, chunk), problem.reload_time(stage, chunk)
    return max(off, rel) if is_duplex(problem) else off + rel
