"""The report of ``benchmarks/gpu_check``: ``gpu_check.json`` and the Markdown table
``gpu_check.md``, both rewritten atomically whenever a number arrives (a run cut short leaves
what it measured)."""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path
from typing import Any

import torch

FORMAT = "optpipe.gpu_check/1"


class Report:
    """The JSON document and its Markdown table, rewritten (atomically) after every change."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.data: dict[str, Any] = {"format": FORMAT, **meta, "sections": {}}
        self.lock = threading.Lock()
        self.write()

    def write(self) -> None:
        with self.lock:
            for name, text in (
                ("gpu_check.json", json.dumps(self.data, indent=2, default=_jsonable)),
                ("gpu_check.md", markdown(self.data)),
            ):
                tmp = self.out / (name + ".tmp")
                tmp.write_text(text + "\n")
                os.replace(tmp, self.out / name)


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, torch.dtype):
        return str(x).replace("torch.", "")
    return str(x)


# -- the Markdown table ---------------------------------------------------------------------------


def _f(x: Any, nd: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{nd}g}"
    return str(x)


def markdown(d: dict[str, Any]) -> str:
    dev = d.get("device", {})
    cpu = dev.get("type") != "cuda"
    mark = " (CPU)" if cpu else ""
    lines = [
        f"# gpu_check on {dev.get('name', '?')}{mark}",
        "",
        f"torch {dev.get('torch')}, CUDA {dev.get('cuda')}, {d.get('started')}, "
        f"budget {d.get('budget_s')} s, {d.get('elapsed_s', '?')} s used"
        + (", **CPU run: these are not GPU measurements**" if cpu else ""),
        "",
        "| section | status | seconds |",
        "|---|---|---|",
    ]
    secs = d.get("sections", {})
    for name, s in secs.items():
        err = f" ({s['error'][:120]})" if s.get("error") else ""
        lines.append(f"| {name} | {s.get('status')}{err} | {_f(s.get('seconds'))} |")
    r = secs.get("copy_engines", {}).get("results", {})
    if r:
        lines += [
            "",
            f"## Copy engines{mark} (GB/s, {r.get('bytes_per_copy', 0) >> 20} MiB copies)",
            "",
        ]
        lines += ["| copy | H2D | D2H |", "|---|---|---|"]
        for label, key in (
            ("pinned, alone", "pinned_alone_GBps"),
            ("pinned, both at once", "pinned_both_GBps"),
            ("pageable", "pageable_GBps"),
            ("engine (pages, 2 streams), alone", "engine_alone_GBps"),
            ("engine, both at once", "engine_both_GBps"),
            ("engine (CPU clones)", "engine"),
        ):
            v = r.get(key)
            if isinstance(v, dict):
                lines.append(
                    f"| {label} | {_f(v.get('h2d') or v.get('h2d_GBps'))} | {_f(v.get('d2h') or v.get('d2h_GBps'))} |"
                )
        if "duplex_ratio" in r:
            lines += [
                "",
                f"Both at once: {_f(r.get('pinned_both_aggregate_GBps'))} GB/s together, "
                f"{_f(r['duplex_ratio'])}x the faster direction alone: full duplex "
                f"{_f(r.get('full_duplex'))}.",
            ]
        if r.get("note"):
            lines += ["", r["note"]]
    r = secs.get("overlap", {}).get("results", {})
    if r:
        lines += ["", f"## Overlap{mark}: {r.get('matmul', '')}", ""]
        lines += [
            f"Alone: {_f(r.get('alone_ms'))} ms per matmul ({_f(r.get('tflops'))} TFLOP/s).",
            "",
        ]
        rows = [(m, r[m]) for m in ("d2h", "h2d", "both") if m in r]
        if rows:
            lines += [
                "| copies | matmul ms | slowdown | D2H GB/s | H2D GB/s |",
                "|---|---|---|---|---|",
            ]
            for m, v in rows:
                lines.append(
                    f"| {m} | {_f(v.get('matmul_ms'))} | {100 * v.get('slowdown', 0):.1f}% | "
                    f"{_f(v.get('d2h_GBps'))} | {_f(v.get('h2d_GBps'))} |"
                )
        if r.get("note"):
            lines += ["", r["note"]]
    r = secs.get("op_costs", {}).get("results", {})
    if r.get("sizes"):
        lines += [
            "",
            f"## Op costs{mark}: {r.get('layers_per_stage')} layers, measured / "
            f"`optpipe problem` estimate ({r.get('device_kind')}, {r.get('timer')})",
            "",
        ]
        lines += [
            "| layer | F ms | B ms | W ms | BW ms | act MB | F | B | W | BW | act | implied eff. |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in r["sizes"]:
            ms, ratio = row.get("measured", {}), row.get("measured_over_estimate", {})
            if not ms:
                continue
            act = ms.get("allocated_bytes", ms.get("activation_bytes", 0.0))
            lines.append(
                f"| {row['layer']} | {1e3 * ms['t_f']:.3g} | {1e3 * ms['t_b']:.3g} | "
                f"{1e3 * ms['t_w']:.3g} | {1e3 * ms['t_bw']:.3g} | {act / 1e6:.4g} | "
                + " | ".join(_f(ratio.get(k)) for k in ("t_f", "t_b", "t_w", "t_bw"))
                + f" | {_f(ratio.get('m_f_allocated', ratio.get('m_f')))} | "
                f"{_f(row.get('implied_efficiency'))} |"
            )
        mem = [row for row in r["sizes"] if "alloc_F" in row.get("measured", {})]
        if mem:
            lines += [
                "",
                "Allocator per op of the stage (MB; left allocated by the op, and peak above it):",
                "",
                "| layer | F | B | W | BW | peak F | peak B | peak W | peak BW |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for row in mem:
                ms = row["measured"]
                cells = [ms.get(f"alloc_{k}") for k in ("F", "B", "W", "BW")]
                cells += [ms.get(f"peak_{k}") for k in ("F", "B", "W", "BW")]
                lines.append(
                    f"| {row['layer']} | "
                    + " | ".join("n/a" if c is None else f"{c / 1e6:.4g}" for c in cells)
                    + " |"
                )
    r = secs.get("stage_schedule", {}).get("results", {})
    if r.get("predicted"):
        pr, ms = r["predicted"], r.get("measured", {})
        sch = r.get("schedule", {})
        lines += [
            "",
            f"## One stage's schedule{mark}: stage {sch.get('stage')} of {sch.get('from')}",
            "",
        ]
        lines += ["| quantity | predicted | measured | measured / predicted |", "|---|---|---|---|"]
        lines.append(
            f"| stage time (s) | {_f(pr.get('stage_time_s'))} | {_f(ms.get('stage_time_s'))} | "
            f"{_f(ms.get('time_over_predicted'))} |"
        )
        if "settle_wait_s" in ms:
            lines.append(
                f"| compute waiting at settle points (s per step) | 0 | "
                f"{_f(ms.get('settle_wait_s'))} | "
                f"{_f(ms.get('settle_wait_share_of_step'))} of the step |"
            )
        peak = ms.get("activation_peak_bytes")
        got = "n/a" if peak is None else f"{peak / 1e6:.4g}"
        lines.append(
            f"| activation peak (MB): simulator + reserve (**goal: within 5%**) | "
            f"{pr['activation_peak_bytes'] / 1e6:.4g} | {got} | "
            f"**{_f(ms.get('peak_over_predicted'))}** |"
        )
        if "simulator_peak_bytes" in pr:
            lines.append(
                f"| activation peak (MB): simulator alone | {pr['simulator_peak_bytes'] / 1e6:.4g} "
                f"| {got} | {_f(ms.get('peak_over_simulator_peak'))} |"
            )
        if "executor_order_peak_bytes" in pr:
            lines.append(
                f"| activation peak (MB): the model in the executor's order + reserve | "
                f"{(pr['executor_order_peak_bytes'] + pr.get('reserve_bytes', 0.0)) / 1e6:.4g} | "
                f"{got} | {_f(ms.get('peak_over_executor_order_plus_reserve'))} |"
            )
        if "rule_model_peak_bytes" in pr:
            lines.append(
                f"| activation peak (MB): the rule (B frees nothing) | "
                f"{pr['rule_model_peak_bytes'] / 1e6:.4g} | {got} | "
                f"{_f(ms.get('peak_over_rule_model'))} |"
            )
        lines += [
            "",
            f"Memory model: {pr.get('model')}; reserve {_f((pr.get('reserve_bytes') or 0) / 1e6)} MB."
            f" Offloads per step: {ms.get('offloads_per_step')} (schedule: "
            f"{ms.get('schedule_offloads')}); gradients against the same order without transfers: "
            f"max diff / max {_f(ms.get('grad_max_abs_diff_over_max'))}; static memory "
            f"{_f((ms.get('static_bytes') or 0) / 1e9)} GB.",
        ]
        lt = r.get("level_trace") or {}
        if "largest_gap_bytes" in lt:
            lines += [
                "",
                "One more step watched per action (allocator above the step's start against the "
                f"simulator's level at each action's start): largest gap "
                f"{lt['largest_gap_bytes'] / 1e6:.4g} MB before {lt['largest_gap_before']}; "
                f"highest point {lt['highest_bytes'] / 1e6:.4g} MB, in {lt['highest_action']} "
                "(every action: `level_trace` in gpu_check.json).",
            ]
        elif lt.get("error"):
            lines += ["", f"Per-action trace failed: {lt['error']}"]
        t = r.get("tight_limit", {})
        if t:
            lines += [
                "",
                f"Limit just under the need: refused before running: {_f(t.get('refused'))}"
                + (f" (`{t.get('error', '')[:160]}`)" if t.get("error") else ""),
            ]
    r = secs.get("gpu_tests", {}).get("results", {})
    if r:
        lines += [
            "",
            f"## gpu-marked tests{mark}",
            "",
            f"`{r.get('summary', '')}` ({len(r.get('files', []))} files)",
        ]
    return "\n".join(lines)
