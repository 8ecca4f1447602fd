"""Importing optpipe_lightning registers "optpipe" with Lightning, lazily (no torch at import)."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_registers_lazily_without_torch() -> None:
    code = (
        "import sys, optpipe_lightning\n"
        "print('torch' in sys.modules)\n"
        "from lightning.pytorch.strategies import StrategyRegistry\n"
        "print(sorted(k for k in StrategyRegistry if k.startswith('optpipe')))\n"
    )
    assert _run(code).splitlines() == ["False", "['optpipe', 'optpipe_fork', 'optpipe_spawn']"]


def test_import_after_lightning_registers_at_once() -> None:
    code = (
        "import lightning.pytorch as pl, optpipe_lightning\n"
        "t = pl.Trainer(strategy='optpipe', accelerator='cpu', devices=2, logger=False)\n"
        "print(type(t.strategy).__name__, t.strategy._start_method)\n"
    )
    assert _run(code).splitlines()[-1] == "OptPipeStrategy popen"
