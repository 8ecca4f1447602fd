"""The GPU path in one prepared run: copy engines, overlap, op costs, one stage's schedule with
offload under a memory limit, and the test suite's ``gpu`` tests.

Usage (from the repository root; the package need not be installed)::

    PYTHONPATH=$PWD python benchmarks/gpu_check --out gpu_check_out
    PYTHONPATH=$PWD python benchmarks/gpu_check --out /tmp/gc --device cpu   # CPU: small sizes

Writes ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` after every section (a run cut short still
leaves what it measured) and prints progress. Sections, each catching its own errors:

1. ``copy_engines``: host-to-device and device-to-host bandwidth from pinned memory, each alone
   and both at once on separate streams (is the channel full duplex?), pageable for comparison,
   and through the executor's ``CudaCopyEngine`` (pinned pages, one stream per direction).
2. ``overlap``: a bf16 matmul of a transformer layer's size alone and while the engine copies
   each way and both ways: how much copies slow compute, and whether they finish under it.
3. ``op_costs``: F, B, W and fused BW of GPT layers (bf16, ``scaled_dot_product_attention``) at
   two sizes, timed by the executor (CUDA events) against ``optpipe problem``'s estimate; bytes
   one microbatch saves (saved-tensor hooks) and allocates against the estimate.
4. ``stage_schedule``: a problem from those costs and bandwidths, solved under a limit that
   forces offload; one stage's action list run by the executor's stage and the real offload
   manager (inputs and incoming gradients made up): measured peak memory and step time against
   the simulator's, and the same list with the limit just under its need refused before it runs.
5. ``gpu_tests``: ``pytest -m gpu`` over the test files that have such tests.

On CPU the same code runs with small sizes; every number is marked as a CPU number. ``--budget-s``
bounds the whole run: a section that would start with too little time left is skipped (and
says so), the tests get what is left, and a watchdog ends the process shortly after the budget.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402

from .copies import copy_engines, overlap  # noqa: E402
from .report import Report  # noqa: E402
from .schedule import stage_schedule  # noqa: E402
from .stage import LayerShape, op_costs  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    dtype: torch.dtype
    copy_bytes: int
    copy_reps: int
    mm_tokens: int
    mm_hidden: int
    mm_reps: int
    shapes: tuple[LayerShape, LayerShape]
    layers_per_stage: int
    op_microbatches: int
    op_steps: int
    stage_shape: int  # index into shapes
    stages: int
    microbatches: int
    limit_fraction: float  # of 1F1B's peak on the first stage (stages x one microbatch)
    stage_steps: int
    solver_seconds: float


GPU_SIZES = Sizes(
    dtype=torch.bfloat16,
    copy_bytes=256 << 20,
    copy_reps=5,
    mm_tokens=8192,
    mm_hidden=4096,
    mm_reps=20,
    shapes=(LayerShape(2048, 16, 2048, 1), LayerShape(4096, 32, 4096, 1)),
    layers_per_stage=2,
    op_microbatches=4,
    op_steps=2,
    stage_shape=1,
    stages=4,
    microbatches=8,
    limit_fraction=0.5,
    stage_steps=3,
    solver_seconds=10.0,
)
# the same sections at sizes a CPU runs in seconds (every field but layers_per_stage differs)
# fmt: off
CPU_SIZES = replace(
    GPU_SIZES, dtype=torch.float32, copy_bytes=4 << 20, copy_reps=3, mm_tokens=256, mm_hidden=128,
    mm_reps=4, shapes=(LayerShape(32, 2, 16, 2), LayerShape(64, 4, 32, 1)), op_microbatches=2,
    op_steps=1, stage_shape=0, stages=2, microbatches=4, limit_fraction=0.6, stage_steps=1,
    solver_seconds=0.3,
)
# fmt: on
# seconds a section needs at least before it is worth starting (GPU sizes; CPU needs less)
MIN_SECONDS = {
    "copy_engines": 8,
    "overlap": 8,
    "op_costs": 25,
    "stage_schedule": 30,
    "gpu_tests": 10,
}
SECTIONS = tuple(MIN_SECONDS)


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Budget:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.t0 = time.perf_counter()

    def used(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.seconds - self.used()


def run_section(
    report: Report,
    name: str,
    budget: Budget,
    need: float,
    fn: Callable[[dict[str, Any], Callable[[], None]], Any],
) -> Any:
    """Run one section: its results appear in the report as they are measured; an exception is
    recorded (type, message, the last frames) and the run goes on."""
    sec: dict[str, Any] = {"status": "running", "results": {}}
    report.data["sections"][name] = sec
    if budget.left() < need:
        sec.update(status="skipped", error=f"budget: {budget.left():.0f} s left, needs ~{need:.0f}")
        log(f"{name}: skipped ({sec['error']})")
        report.write()
        return None
    log(f"{name}: start ({budget.left():.0f} s of budget left)")
    report.write()
    t0 = time.perf_counter()
    out = None
    try:
        out = fn(sec["results"], report.write)
        sec["status"] = "ok"
    except Exception as e:  # every section records its own failure and the run goes on
        sec["status"] = "error"
        sec["error"] = f"{type(e).__name__}: {e}".strip().splitlines()[0][:500]
        # torch wraps a failing backward in a RuntimeError whose message says little: keep the
        # causes too (the chain's root names the real failure)
        causes: list[str] = []
        c = e.__cause__ or e.__context__
        while c is not None and len(causes) < 4:
            causes.append(f"{type(c).__name__}: {c}".strip().splitlines()[0][:500])
            c = c.__cause__ or c.__context__
        if causes:
            sec["causes"] = causes
            sec["error"] += f" (caused by {causes[-1]})"
        sec["traceback"] = traceback.format_exc().splitlines()[-40:]
        log(f"{name}: ERROR {sec['error']}")
    sec["seconds"] = round(time.perf_counter() - t0, 2)
    log(f"{name}: {sec['status']} in {sec['seconds']:.1f} s")
    report.write()
    return out


# -- 5. the test suite's gpu tests ----------------------------------------------------------------


def gpu_tests(res: dict[str, Any], flush: Callable[[], None], budget: Budget) -> None:
    files = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if "mark.gpu" in p.read_text(errors="ignore")
    )
    res["files"] = files
    if not files:
        res["summary"] = "no gpu-marked tests"
        return
    # one process (the GPU machine may lack pytest-xdist, which the project's addopts use)
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider"]
    cmd += ["-o", "addopts=--strict-markers", "-p", "no:xdist"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *(x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x)]
    )
    timeout = max(5.0, budget.left() - 3.0)
    res["command"] = " ".join(cmd + files)
    try:
        done = subprocess.run(
            cmd + files, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        out, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc = None
        res["timed_out_after_s"] = timeout
    res["returncode"] = rc
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    res["output_tail"] = lines[-25:]
    summary = next(
        (ln for ln in reversed(lines) if re.search(r"\d+ (passed|failed|skipped|error)", ln)), ""
    )
    res["summary"] = summary.strip("= ")
    for word in ("passed", "failed", "skipped", "error", "errors"):
        m = re.search(rf"(\d+) {word}\b", summary)
        if m:
            res[word] = int(m.group(1))
    flush()
    if rc not in (0, 5):  # 5: nothing collected (CPU: every gpu test deselected or skipped)
        raise RuntimeError(f"pytest exited with {rc}: {res['summary'] or 'see output_tail'}")


# -- main -----------------------------------------------------------------------------------------


def goal_summary(data: dict[str, Any]) -> str:
    """One line with the numbers the goals are judged on (empty when none was measured)."""
    ms = data["sections"].get("stage_schedule", {}).get("results", {}).get("measured", {})
    parts = []
    if ms.get("peak_over_predicted") is not None:
        parts.append(
            f"stage peak memory measured / predicted (simulator + reserve) = "
            f"{ms['peak_over_predicted']:.3f} (goal within 5%: "
            f"{'met' if ms.get('peak_within_5pct') else 'NOT met'}; simulator alone "
            f"{ms.get('peak_over_simulator_peak', float('nan')):.3f}, in the executor's order "
            f"+ reserve {ms.get('peak_over_executor_order_plus_reserve', float('nan')):.3f}, "
            "the old rule "
            f"{ms.get('peak_over_rule_model', float('nan')):.3f})"
        )
    lt = data["sections"].get("stage_schedule", {}).get("results", {}).get("level_trace") or {}
    if "largest_gap_bytes" in lt:
        parts.append(
            f"allocator above the model by at most {lt['largest_gap_bytes'] / 1e6:.4g} MB "
            f"(before {lt['largest_gap_before']})"
        )
    if ms.get("time_over_predicted") is not None:
        parts.append(f"stage time measured / simulated = {ms['time_over_predicted']:.3f}")
    return "; ".join(parts)


def device_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "type": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            name=props.name, total_memory=props.total_memory, sm_count=props.multi_processor_count
        )
    else:
        info.update(name="cpu", threads=torch.get_num_threads())
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for gpu_check.json/.md")
    ap.add_argument("--budget-s", type=float, default=210.0, help="wall seconds for the whole run")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--sizes", choices=("auto", "gpu", "cpu"), default="auto", help="problem sizes")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma list of sections to run")
    args = ap.parse_args(argv)
    want = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(want) - set(SECTIONS))
    if unknown:
        ap.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    sizes = {"gpu": GPU_SIZES, "cpu": CPU_SIZES}.get(args.sizes) or (
        GPU_SIZES if cuda else CPU_SIZES
    )
    scale = 1.0 if sizes is GPU_SIZES else 0.1
    budget = Budget(args.budget_s)
    report = Report(
        args.out,
        {
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "budget_s": args.budget_s,
            "device": device_info(device),
            "sizes": "gpu" if sizes is GPU_SIZES else "cpu",
            "command": " ".join(
                [os.path.relpath(sys.argv[0], ROOT) if sys.argv else "", *(argv or sys.argv[1:])]
            ),
        },
    )
    log(
        f"device {report.data['device']['name']} ({device}), sizes {report.data['sizes']}, "
        f"budget {args.budget_s:.0f} s, writing {args.out}"
    )

    def watchdog() -> None:  # the budget is a promise: end the process if a section hangs
        report.data["aborted"] = f"watchdog: still running {args.budget_s + 30:.0f} s after start"
        report.data["elapsed_s"] = round(budget.used(), 1)
        report.write()
        log(report.data["aborted"])
        os._exit(3)

    dog = threading.Timer(args.budget_s + 30.0, watchdog)
    dog.daemon = True
    dog.start()

    def need(name: str) -> float:
        return MIN_SECONDS[name] * scale

    try:
        bandwidth = None
        if "copy_engines" in want:
            bandwidth = run_section(
                report,
                "copy_engines",
                budget,
                need("copy_engines"),
                lambda r, fl: copy_engines(r, fl, sizes.copy_bytes, sizes.copy_reps, device),
            )
        if "overlap" in want:
            run_section(
                report,
                "overlap",
                budget,
                need("overlap"),
                lambda r, fl: overlap(
                    r,
                    fl,
                    sizes.mm_tokens,
                    sizes.mm_hidden,
                    sizes.mm_reps,
                    sizes.copy_bytes,
                    sizes.dtype,
                    device,
                ),
            )
        costs = None
        if "op_costs" in want:
            costs = run_section(
                report,
                "op_costs",
                budget,
                need("op_costs"),
                lambda r, fl: op_costs(
                    r,
                    fl,
                    list(sizes.shapes),
                    sizes.layers_per_stage,
                    sizes.op_microbatches,
                    sizes.op_steps,
                    sizes.dtype,
                    device,
                ),
            )
        if "stage_schedule" in want:
            shape = sizes.shapes[sizes.stage_shape]
            run_section(
                report,
                "stage_schedule",
                budget,
                need("stage_schedule"),
                lambda r, fl: stage_schedule(
                    r,
                    fl,
                    shape,
                    sizes.layers_per_stage,
                    sizes.stages,
                    sizes.microbatches,
                    sizes.limit_fraction,
                    sizes.stage_steps,
                    sizes.solver_seconds,
                    (costs or {}).get(shape),
                    bandwidth,
                    sizes.dtype,
                    device,
                ),
            )
        if "gpu_tests" in want:
            if cuda:  # the tests run in a child process: hand it the memory this one caches
                gc.collect()
                torch.cuda.empty_cache()
            run_section(
                report,
                "gpu_tests",
                budget,
                need("gpu_tests"),
                lambda r, fl: gpu_tests(r, fl, budget),
            )
    finally:
        dog.cancel()
    report.data["elapsed_s"] = round(budget.used(), 1)
    report.write()
    goals = goal_summary(report.data)
    if goals:
        log(goals)
    bad = [n for n, s in report.data["sections"].items() if s["status"] != "ok"]
    log(
        f"done in {budget.used():.1f} s; "
        + (f"not ok: {bad}" if bad else "all sections ok")
        + f"; {args.out / 'gpu_check.md'}"
    )
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        # the engines hold the group in reference cycles: collect them now, while its threads
        # exist. Left to a later collection in a process forked from this one (the test suite
        # forks training ranks), ~ProcessGroupGloo joins threads the child never had: a hang.
        gc.collect()
    except Exception as e:  # tearing down: say so, the results are written
        log(f"destroying the process group failed: {e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
