"""``benchmarks/gpu_check.py`` runs on CPU (small sizes, numbers marked CPU): every section but the
pytest one, which the GPU run adds. Also: a failing section is recorded and the run goes on; a
spent budget skips sections instead of running past it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gpu_check
import pytest

RUN = ["--device", "cpu", "--sections", "copy_engines,overlap,op_costs,stage_schedule"]


def _load(out: Path) -> dict[str, Any]:
    data = json.loads((out / "gpu_check.json").read_text())
    assert data["format"] == "optpipe.gpu_check/1"
    return data


def test_the_check_runs_on_cpu_and_writes_json_and_markdown(tmp_path: Path) -> None:
    rc = gpu_check.main(["--out", str(tmp_path), "--budget-s", "120", *RUN])
    data = _load(tmp_path)
    secs = data["sections"]
    assert rc == 0, {k: v.get("error") for k, v in secs.items()}
    assert data["device"]["type"] == "cpu" and data["sizes"] == "cpu"
    assert [k for k, v in secs.items() if v["status"] == "ok"] == list(secs)
    assert secs["copy_engines"]["results"]["engine"]["d2h_GBps"] > 0
    sizes = secs["op_costs"]["results"]["sizes"]
    assert len(sizes) == 2
    for row in sizes:
        for k in ("t_f", "t_b", "t_w", "t_bw"):
            assert row["measured"][k] > 0 and row["estimate"][k] > 0
        assert row["measured"]["saved_bytes"] > 0 and row["estimate"]["m_f"] > 0
    st = secs["stage_schedule"]["results"]
    ms = st["measured"]
    assert ms["offloads_per_step"] == ms["schedule_offloads"] > 0
    assert ms["grad_max_abs_diff_over_max"] == 0.0  # offload changes no numbers
    assert st["predicted"]["stage_time_s"] > 0 and ms["stage_time_s"] > 0
    assert st["tight_limit"]["refused"] and st["tight_limit"]["one_line"]
    assert "not feasible" in st["tight_limit"]["error"]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "(CPU)" in md and "not GPU measurements" in md
    assert "| stage time (s) |" in md


def test_a_failing_section_is_recorded_and_the_rest_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("copy engine on fire")

    monkeypatch.setattr(gpu_check, "copy_engines", broken)
    rc = gpu_check.main(
        ["--out", str(tmp_path), "--device", "cpu", "--sections", "copy_engines,overlap"]
    )
    secs = _load(tmp_path)["sections"]
    assert rc == 1
    assert secs["copy_engines"]["status"] == "error"
    assert secs["copy_engines"]["error"] == "RuntimeError: copy engine on fire"
    assert secs["overlap"]["status"] == "ok"


def test_a_spent_budget_skips_sections(tmp_path: Path) -> None:
    rc = gpu_check.main(["--out", str(tmp_path), "--budget-s", "0", *RUN])
    secs = _load(tmp_path)["sections"]
    assert rc == 1
    assert {v["status"] for v in secs.values()} == {"skipped"}
    assert secs["op_costs"]["error"].startswith("budget:")
