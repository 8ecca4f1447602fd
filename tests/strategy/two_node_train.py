"""One "node" of the two-node test: run by ``torchrun --nnodes=2 --nproc-per-node=2``.

Lightning sees torchrun's environment (``TorchElasticEnvironment``) and the strategy runs its
own launch path with ``Trainer(num_nodes=2, devices=2)``: a 4-stage pipeline over 2 x 2
processes. Global rank 0 saves the metrics after every training batch and validation epoch and
the trained parameters to the path given as the only argument.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from pipelined_lm import LM, MetricsRecorder, trainer

import optpipe_lightning  # noqa: F401
from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy


def main(out: str) -> None:
    torch.set_num_threads(1)
    model = LM()
    rec = MetricsRecorder()
    strategy = OptPipeStrategy(
        schedule="1f1b",
        num_microbatches=4,
        profile_steps=0,
        online_resolve=False,
        use_database=False,
    )
    tr = trainer(2, strategy, num_nodes=2, callbacks=[rec])
    tr.fit(model)
    if tr.global_rank == 0:
        world = {
            "nodes": tr.num_nodes,
            "devices": tr.num_devices,
            "world_size": tr.world_size,
            "num_stages": strategy.num_stages,
        }
        torch.save({"rows": rec.rows, "state": model.state_dict(), "world": world}, out)


if __name__ == "__main__":
    main(sys.argv[1])
