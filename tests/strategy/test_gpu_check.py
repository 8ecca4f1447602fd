"""``benchmarks/gpu_check`` runs on CPU (small sizes, numbers marked CPU): every section but the
pytest one, which the GPU run adds. Also: a failing section is recorded and the run goes on; a
spent budget skips sections instead of running past it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_check import run as gpu_check
from gpu_check import stage as gpu_check_stage

from optpipe_lightning.strategy.runtime.op_memory import OpMemoryWatch

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
    # compute's waits at settle points (CPU copies are synchronous clones: done at once)
    assert ms["settle_wait_s"] >= 0.0 and ms["settle_wait_share_of_step"] < 0.5
    assert ms["peak_over_predicted"] is None  # no allocator statistics on CPU
    assert "| compute waiting at settle points (s per step) |" in md


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


class _ScriptedWatch(OpMemoryWatch):
    """The allocator watch of the op-cost engine, on CPU: every op, once its window opens, moves
    a made-up allocator as ``table`` says ((op, chunk) -> (bytes left, transient above))."""

    def __init__(self, table: dict[tuple[str, int], tuple[int, int]]) -> None:
        self.fake = {"now": 1 << 30, "high": 1 << 30}
        super().__init__(self)  # type: ignore[arg-type]  # it is its own allocator
        self.table = table

    def allocated(self) -> int:
        return self.fake["now"]

    def peak(self) -> int:
        return self.fake["high"]

    def reset_peak(self) -> None:
        self.fake["high"] = self.fake["now"]

    def begin(self, op: str, chunk: int) -> None:
        super().begin(op, chunk)
        leaves, transient = self.table[(op, chunk)]
        now = self.fake["now"]
        self.fake["high"] = max(self.fake["high"], max(now, now + leaves) + transient)
        self.fake["now"] = now + leaves


def test_the_stage_is_predicted_on_measured_per_op_memory_plus_the_reserve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPU has no allocator counter: made-up readings (B keeps 0.7 of the activation until W,
    ops rise above their ends) drive the accounting the GPU run uses, end to end."""
    shape = gpu_check.CPU_SIZES.shapes[gpu_check.CPU_SIZES.stage_shape]
    layers = gpu_check_stage.make_layers(shape, 2, torch.float32, torch.device("cpu"))
    act = int(
        gpu_check_stage.measure_microbatch_memory(
            layers[1:], shape, torch.float32, torch.device("cpu")
        )["activation_bytes"]
    )
    a = act // 10
    table = {
        ("F", 1): (10 * a, 3 * a),
        ("B", 1): (7 * a, 5 * a),
        ("W", 1): (-17 * a, a),
        ("BW", 1): (-10 * a, 4 * a),
        ("F", 0): (0, 0),
        ("BW", 0): (0, 2 * a),
    }
    monkeypatch.setattr(gpu_check_stage, "memory_watch", lambda _d: _ScriptedWatch(table))
    rc = gpu_check.main(
        ["--out", str(tmp_path), "--device", "cpu", "--sections", "op_costs,stage_schedule"]
    )
    secs = _load(tmp_path)["sections"]
    assert rc == 0, {k: v.get("error") for k, v in secs.items()}
    ms = secs["op_costs"]["results"]["sizes"][0]["measured"]
    assert [ms[f"alloc_{op}"] for op in ("F", "B", "W", "BW")] == [10 * a, 7 * a, -17 * a, -10 * a]
    assert [ms[f"peak_{op}"] for op in ("F", "B", "W", "BW")] == [3 * a, 5 * a, a, 4 * a]
    st = secs["stage_schedule"]["results"]
    pb, pr = st["problem"], st["predicted"]
    assert (pb["m_f"], pb["m_b"], pb["m_w"]) == (10 * a, 7 * a, -17 * a)
    assert pb["memory_model"].startswith("measured per op")
    assert pr["reserve_bytes"] == 5 * a  # the largest transient of the stage's ops
    assert pr["activation_peak_bytes"] == pr["simulator_peak_bytes"] + 5 * a
    assert pr["simulator_peak_bytes"] >= 10 * a  # at least one microbatch's activation
    # the executor frees an offload no earlier, and allocates a reload no later, than the model
    assert pr["executor_order_peak_bytes"] >= pr["simulator_peak_bytes"]
    assert st["measured"]["activation_peak_bytes"] is None  # CPU: no measured peak to compare
    # one more step watched per action against the simulator's level: the made-up allocator
    # moves as the model does, except that it does not see offloads (the model frees their
    # bytes while they sit on the host): the gap is what is offloaded at that moment
    trace = st["level_trace"]
    gaps = [r["measured"] - r["model"] for r in trace["rows"]]
    assert trace["rows"][0]["measured"] == trace["rows"][0]["model"] == 0.0
    assert min(gaps) >= 0.0 and max(gaps) == trace["largest_gap_bytes"] > 0.0
    assert trace["largest_gap_bytes"] <= st["measured"]["offloads_per_step"] * pb["offload_bytes"]
    assert trace["highest_bytes"] >= pr["simulator_peak_bytes"]
