"""Who talks to whom: the pipeline and data-parallel groups, and the collectives the strategy uses.

World rank ``r * p + s`` is stage ``s`` of pipeline replica ``r`` (``p`` stages, ``d`` replicas):
one pipeline group per replica (its ``p`` stages), one data-parallel group per stage (its ``d``
copies). ``PipelineComm`` carries the groups and this rank's place in them, with the two
collectives every part of the strategy needs: an object broadcast from global rank 0 (the rank
that decides: schedules, calibrations, re-solves) and an all-gather over this pipeline; a second
group per pipeline carries only the training step's loss hand-out. Without
a process group (tests in one process) both are the identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


def gather(obj: Any, group: Any) -> list[Any]:
    """Every rank's ``obj`` of ``group``, in rank order (``[obj]`` without a process group)."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


@dataclass
class PipelineComm:
    """This rank's groups and the collectives over them."""

    num_stages: int
    data_parallel: int = 1
    global_rank: int = 0
    pp_group: Any = None  # this replica's pipeline (None: no process group)
    dp_group: Any = None  # this stage's replicas (None: one replica)
    # this replica's pipeline again, for the training step's loss hand-out alone: the last
    # stage starts it while the pipeline's own traffic is in flight (NCCL needs one order of
    # collectives per group, gloo one per group in practice); None: it goes over ``pp_group``
    # after the step
    handout_group: Any = None
    # every rank, for the training loop's per-step SIGTERM flag (``lightning/sigterm_check.py``:
    # asynchronous, in flight while the pipeline runs); None: one process
    control_group: Any = None

    @property
    def pp_rank(self) -> int:
        return self.global_rank % self.num_stages

    @property
    def dp_rank(self) -> int:
        return self.global_rank // self.num_stages

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def broadcast(self, obj: Any) -> Any:
        """Global rank 0's ``obj`` on every rank of the world."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, 0, group=dist.group.WORLD)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every stage's ``obj`` of this pipeline, in stage order."""
        return gather(obj, self.pp_group)


def make_groups(num_stages: int, data_parallel: int, global_rank: int) -> PipelineComm:
    """The pipeline and data-parallel groups (every rank creates every group, in one order)."""
    comm = PipelineComm(num_stages, data_parallel, global_rank)
    p, d = num_stages, data_parallel
    if p * d > 1:
        comm.control_group = dist.new_group(list(range(p * d)))
    if d == 1:
        comm.pp_group = dist.group.WORLD
        comm.handout_group = dist.new_group(list(range(p)))
        return comm
    for r in range(d):
        ranks = list(range(r * p, (r + 1) * p))
        g, h = dist.new_group(ranks), dist.new_group(ranks)
        if r == comm.dp_rank:
            comm.pp_group, comm.handout_group = g, h
    for s in range(p):
        g = dist.new_group([r * p + s for r in range(d)])
        if s == comm.pp_rank:
            comm.dp_group = g
    return comm


def release_step_groups(comm: PipelineComm) -> None:
    """Destroy the loss hand-out's and the SIGTERM flag's groups (``make_groups`` made them; a
    run that ended cleanly has nothing in flight there): their threads go now, not in the
    interpreter's exit, where a group torn down with its peers already gone can abort the
    process."""
    groups = (comm.handout_group, comm.control_group)
    comm.handout_group = comm.control_group = None
    if not (dist.is_available() and dist.is_initialized()):
        return
    for group in groups:
        if group is not None:
            dist.destroy_process_group(group)
