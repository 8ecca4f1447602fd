"""Lightning's per-step SIGTERM check under the strategy (``lightning/sigterm_check.py``): every
rank raises ``SIGTERMException`` at the same step after rank 0 received SIGTERM (one step later
than Lightning's blocking check), and a rank does not wait at a step's start for the others to
reach it (Lightning's check is a blocking broadcast from rank 0 there)."""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lightning.pytorch.utilities.exceptions import SIGTERMException

from optpipe_lightning.strategy.lightning.sigterm_check import SigtermCheck, install, uninstall


def _worker(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        group = dist.new_group(list(range(world)))
        store = dist.FileStore(os.path.join(out, "handshake"), world)
        store.set_timeout(timedelta(seconds=60))
        trainer = SimpleNamespace(received_sigterm=False)
        check = SigtermCheck(trainer, group, torch.device("cpu"))
        # rank 1 runs two step starts while rank 0 is still in its first step
        if rank == 0:
            check()
            store.wait(["rank1-two-steps"])
        else:
            check()
            check()
            store.set("rank1-two-steps", "1")
        raised = None
        for step in range(1 if rank == 1 else 0, 6):  # rank 1 has done step 1 already
            if rank == 0 and step == 2:
                trainer.received_sigterm = True  # on rank 0 only, as a signal arrives
            try:
                check()
            except SIGTERMException:
                raised = step
                break
        torch.save(raised, os.path.join(out, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
def test_every_rank_stops_at_one_step_and_no_rank_waits_at_a_step_start() -> None:
    world = 2
    with tempfile.TemporaryDirectory() as d:
        init = f"file://{os.path.join(d, 'store')}"
        mp.start_processes(
            _worker, args=(world, init, d), nprocs=world, join=True, start_method="fork"
        )
        raised = [torch.load(os.path.join(d, f"{r}.pt")) for r in range(world)]
    # rank 0 received SIGTERM before its step 2's check: every rank stops at step 3
    assert raised == [3, 3]


def test_installed_on_the_fit_loop_where_lightning_has_the_blocking_check() -> None:
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    loop: Any = trainer.fit_loop.epoch_loop
    if not hasattr(type(loop), "_broadcast_sigterm_tensor"):
        assert install(trainer, object(), torch.device("cpu")) is None  # older Lightning
        return
    assert install(trainer, None, torch.device("cpu")) is None  # one process: nothing to do
    check = install(trainer, object(), torch.device("cpu"))
    assert check is not None and loop._broadcast_sigterm_tensor is check
    uninstall(trainer, check, clean=True)
    assert "_broadcast_sigterm_tensor" not in loop.__dict__  # Lightning's own again
