"""Lightning's per-step SIGTERM check, without a per-step meeting of all ranks.

Lightning (2.5 and later) broadcasts rank 0's "received SIGTERM" flag at the start of every
training batch (``_TrainingEpochLoop._broadcast_sigterm_tensor``), a blocking collective. Under
data parallelism every rank meets there anyway; in a pipeline it is a barrier between steps that
torch's own schedules do not have: a stage whose next step can start (the first stage's
forwards need nothing from the others) waits until the last rank has finished its step and its
optimizer update, so the tail of one step no longer overlaps the head of the next (zbv on 2 CPU
processes: ~10 ms of a 230 ms step on rank 0).

``SigtermCheck`` keeps the contract (every rank raises ``SIGTERMException`` at the same step once
rank 0 received SIGTERM) with the flag one step late: each step posts rank 0's flag as an
asynchronous broadcast over a group of its own and reads the previous step's, which every rank
posted a step ago (no wait in practice).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.utilities.exceptions import SIGTERMException

_HOOK = "_broadcast_sigterm_tensor"


class SigtermCheck:
    """Installed on a fit's training epoch loop in place of Lightning's blocking check."""

    def __init__(self, trainer: Any, group: Any, device: torch.device) -> None:
        self.trainer = trainer
        self.group = group
        self.device = device
        self._pending: tuple[Any, torch.Tensor] | None = None

    def __call__(self) -> None:
        flag = self.finish()
        box = torch.tensor(
            [1 if getattr(self.trainer, "received_sigterm", False) else 0], device=self.device
        )
        self._pending = (dist.broadcast(box, src=0, group=self.group, async_op=True), box)
        if flag:
            with contextlib.suppress(Exception):
                dist.barrier(group=self.group)  # every rank leaves together, as Lightning's
            raise SIGTERMException()

    def finish(self) -> bool:
        """Wait for the flag posted last (every rank posted it at its last step's start);
        whether rank 0 had received SIGTERM then."""
        pending, self._pending = self._pending, None
        if pending is None:
            return False
        pending[0].wait()
        return bool(pending[1].item() == 1)


def install(trainer: Any, group: Any, device: torch.device) -> SigtermCheck | None:
    """Put a ``SigtermCheck`` on ``trainer``'s training epoch loop where Lightning has the
    blocking check (None where this Lightning has none, or without a group)."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    if group is None or loop is None or not hasattr(type(loop), _HOOK):
        return None
    check = SigtermCheck(trainer, group, device)
    setattr(loop, _HOOK, check)  # the instance's attribute: the class keeps Lightning's
    return check


def uninstall(trainer: Any, check: SigtermCheck | None, clean: bool) -> None:
    """Take the check off the loop; after a clean run, wait for its last flag (posted on every
    rank) so the group has nothing in flight."""
    if check is None:
        return
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    if loop is not None and loop.__dict__.get(_HOOK) is check:
        del loop.__dict__[_HOOK]
    if clean:
        with contextlib.suppress(Exception):
            check.finish()
