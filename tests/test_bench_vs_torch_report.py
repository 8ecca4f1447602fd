"""``benchmarks/bench_vs_torch.py --report FILE``: a file it cannot use is one line naming the
problem and the fix, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_vs_torch.py"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot read --report"),
        ("not json", "is not JSON"),
        ('{"a": 1}', "holds no runs"),
    ],
)
def test_an_unusable_report_file_is_one_line(
    tmp_path: Path, content: str | None, says: str
) -> None:
    path = tmp_path / "p.json"
    if content is not None:
        path.write_text(content)
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--report", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert says in lines[0] and str(path) in lines[0] and "--json" in lines[0]
