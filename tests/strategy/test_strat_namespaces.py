"""Both Lightning namespaces register "optpipe" and accept the strategy; pytorch_lightning fits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from optpipe_lightning.strategy.lightning.namespaces import classic_source

pytest.importorskip("pytorch_lightning", reason="pip install pytorch-lightning (the dev extra)")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"


def _run(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


@pytest.mark.parametrize(
    ("namespace", "face"),
    [("lightning.pytorch", "lightning"), ("pytorch_lightning", "pytorch_lightning")],
)
@pytest.mark.parametrize("optpipe_first", [True, False])
def test_each_namespace_registers_and_accepts_the_strategy(
    namespace: str, face: str, optpipe_first: bool
) -> None:
    imports = [f"import {namespace} as pl", "import optpipe_lightning"]
    code = "\n".join(imports[::-1] if optpipe_first else imports) + (
        "\nfrom optpipe_lightning.strategy import " + face + " as face\n"
        "print(sorted(k for k in pl.strategies.StrategyRegistry if k.startswith('optpipe')))\n"
        "t = pl.Trainer(strategy='optpipe', accelerator='cpu', devices=2, logger=False)\n"
        "print(type(t.strategy) is face.OptPipeStrategy, t.strategy._start_method)\n"
        "t = pl.Trainer(strategy=face.OptPipeStrategy(), accelerator='cpu', devices=2, logger=False)\n"
        "print(isinstance(t.strategy, pl.strategies.ParallelStrategy))\n"
    )
    assert _run(code)[-3:] == ["['optpipe', 'optpipe_fork', 'optpipe_spawn']", "True popen", "True"]


def test_the_classic_face_rewrites_only_lightnings_two_names() -> None:
    src = "import lightning.pytorch as pl\nfrom lightning.fabric.x import y\nimport optpipe_lightning.strategy.lightning.strategy\n"
    assert classic_source(src) == (
        "import pytorch_lightning as pl\nfrom lightning_fabric.x import y\n"
        "import optpipe_lightning.strategy.lightning.strategy\n"
    )


@pytest.mark.dist
@pytest.mark.slow
def test_a_two_process_fit_under_pytorch_lightning(tmp_path: Path) -> None:
    # the example, written for lightning.pytorch, rewritten as a pytorch_lightning user has it
    src = classic_source(EXAMPLE.read_text()).replace(
        "optpipe_lightning.strategy.lightning.strategy",
        "optpipe_lightning.strategy.pytorch_lightning",
    )
    assert "lightning.pytorch" not in src and "import pytorch_lightning as pl" in src
    script = tmp_path / "train_classic.py"
    script.write_text(src + "\nassert 'lightning.pytorch' not in __import__('sys').modules\n")
    cmd = [sys.executable, str(script), "--devices", "2", "--steps", "4", "--layers", "2"]
    cmd += ["--dim", "32", "--heads", "2", "--seq", "16", "--vocab", "32", "--batch", "8"]
    cmd += ["--time-limit", "2", "--val-every", "4", "--no-progress-bar"]
    cmd += ["--db", f"sqlite:///{tmp_path}/fit.db"]
    from pipelined_lm import free_port

    # a port of its own, as the other process-launching tests take (Lightning's own pick can
    # race another xdist worker's launch for the same free port and join its rendezvous)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final loss" in out.stdout
