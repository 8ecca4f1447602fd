"""Small helpers shared by the fixed-rule generators (gpipe, 1F1B, Zero Bubble, zb-auto)."""

from __future__ import annotations

from ..problem import Problem
from . import NotApplicable


def require_single_chunk(problem: Problem, name: str, alternative: str) -> None:
    """Raise ``NotApplicable`` unless the problem has one chunk per stage."""
    if problem.num_chunks != 1:
        raise NotApplicable(
            f"{name} runs one chunk per stage, the problem has num_chunks={problem.num_chunks}"
            f" (use {alternative})"
        )


def capped_warmups(num_stages: int, num_microbatches: int, per_stage: int) -> list[int]:
    """Warm-up forward counts ``per_stage * (p - s - 1)``, capped at m (non-increasing in s)."""
    return [min(per_stage * (num_stages - s - 1), num_microbatches) for s in range(num_stages)]
