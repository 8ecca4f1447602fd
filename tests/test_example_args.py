"""examples/train_gpt.py refuses a count below 1 with argparse's one usage line (exit 2), never
a Lightning traceback about another option (``--steps -1`` named ``val_check_interval``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_gpt.py"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--devices", "0"], "argument --devices: must be at least 1, got 0"),
        (["--steps", "-1"], "argument --steps: must be at least 1, got -1"),
        (["--batch", "two"], "argument --batch: 'two' is not a whole number"),
    ],
)
def test_bad_count_is_one_usage_line(args: list[str], needle: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE.parents[1])}
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 2
    assert needle in r.stderr
    assert "Traceback" not in r.stderr
