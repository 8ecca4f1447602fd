"""Tidy frames of one training run for the Training page, from the rows ``data.training`` reads.

Pure functions: lists of row dicts in (steps, metrics, switches, calibrations as the database's
rows give them, times in seconds, bytes in bytes), frames in display units out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ..schedule.units import Unit, byte_unit, format_seconds, time_unit

Rows = Sequence[Mapping[str, Any]]


def step_unit(steps: Rows) -> Unit:
    """The time unit of the run's step times."""
    return time_unit(max((float(r["measured_seconds"]) for r in steps), default=0.0))


def step_frame(steps: Rows, unit: Unit) -> pd.DataFrame:
    """Step times in long form: step, series (measured / predicted), value (in ``unit``)."""
    rows = []
    for r in steps:
        step = int(r["step"])
        if r.get("measured_seconds") is not None:
            rows.append(
                {"step": step, "series": "measured", "value": r["measured_seconds"] / unit.scale}
            )
        if r.get("predicted_seconds") is not None:
            rows.append(
                {"step": step, "series": "predicted", "value": r["predicted_seconds"] / unit.scale}
            )
    return pd.DataFrame(rows, columns=["step", "series", "value"])


def metric_frame(metrics: Rows) -> pd.DataFrame:
    """Metrics as a table: step, name, value (None where the run logged NaN / infinity)."""
    return pd.DataFrame(
        [{"step": int(r["step"]), "name": r["name"], "value": r["value"]} for r in metrics],
        columns=["step", "name", "value"],
    )


def loss_frame(metrics: Rows) -> pd.DataFrame:
    """Training and validation loss: step, series (train / validation), value."""
    names = {"train_loss": "train", "val_loss": "validation"}
    rows = [
        {"step": int(r["step"]), "series": names[r["name"]], "value": r["value"]}
        for r in metrics
        if r["name"] in names and r["value"] is not None
    ]
    return pd.DataFrame(rows, columns=["step", "series", "value"])


def throughput_frame(metrics: Rows, steps: Rows) -> tuple[pd.DataFrame, str]:
    """Tokens per second when the run counted tokens, else samples per second, per step (the
    count over the step's measured time); ``(frame with step and value, "tokens" | "samples")``."""
    seconds = {int(r["step"]): float(r["measured_seconds"]) for r in steps}
    counts: dict[str, dict[int, float]] = {"tokens": {}, "samples": {}}
    for r in metrics:
        if r["name"] in counts and r["value"] is not None:
            counts[r["name"]][int(r["step"])] = float(r["value"])
    what = "tokens" if counts["tokens"] else "samples"
    rows = [
        {"step": step, "value": n / seconds[step]}
        for step, n in sorted(counts[what].items())
        if seconds.get(step, 0.0) > 0
    ]
    return pd.DataFrame(rows, columns=["step", "value"]), what


def memory_unit(steps: Rows, detail: Mapping[str, Any]) -> Unit:
    peaks = [float(x) for r in steps for x in (r.get("peak_memory") or [])]
    limits = [float(x) for x in (detail.get("memory_limit") or [])]
    return byte_unit(max([*peaks, *limits, 0.0]))


def rank_memory_frame(steps: Rows, unit: Unit) -> pd.DataFrame:
    """Peak memory per rank and step: step, rank, value (in ``unit``)."""
    rows = [
        {"step": int(r["step"]), "rank": rank, "value": float(b) / unit.scale}
        for r in steps
        for rank, b in enumerate(r.get("peak_memory") or [])
    ]
    return pd.DataFrame(rows, columns=["step", "rank", "value"])


def limit_frame(detail: Mapping[str, Any], ranks: int, unit: Unit) -> pd.DataFrame:
    """What each rank's peak is held against: the limit the run recorded, else the device's
    memory. Columns rank, limit (in ``unit``), what."""
    recorded = detail.get("memory_limit")
    if recorded:
        rows = [
            {"rank": r, "limit": float(x) / unit.scale, "what": "memory limit"}
            for r, x in enumerate(recorded)
        ]
    elif detail.get("device_memory"):
        rows = [
            {"rank": r, "limit": float(detail["device_memory"]) / unit.scale, "what": "device"}
            for r in range(ranks)
        ]
    else:
        rows = []
    return pd.DataFrame(rows, columns=["rank", "limit", "what"])


def _gain(before: float | None, after: float | None) -> tuple[str, str]:
    """('0.695 s -> 0.644 s (-7.4%)', '-7.4%') for a predicted step time change."""
    if after is None:
        return "", ""
    if before is None or before <= 0:
        return f"{format_seconds(after)} per step", ""
    change = after / before - 1.0
    pct = f"{change:+.1%}"
    return f"{format_seconds(before)} → {format_seconds(after)} ({pct})", pct


PROFILING_SCHEDULE = "optpipe-profiling"  # what runs before the first stored schedule
LABEL_CHAR_PX = 6.0  # the event labels' width per character (10 px font) ...
LABEL_LANE_PX = 12  # ... and the height of one row of labels
CHART_WIDTH_PX = 700.0  # the narrowest the step-time chart is drawn


def events_frame(switches: Rows, calibrations: Rows, schedules: Mapping[int, str]) -> pd.DataFrame:
    """Schedule switches and re-calibrations in step order: step, kind (switch / calibration),
    what (schedules involved, named as the training log names them: ``optpipe-profiling ->
    optpipe (#9)``), gain (predicted step time before -> after), reason, short (the chart's
    label) and label_y (pixels from the top: labels that would overlap go on rows below)."""

    def name(sid: Any) -> str:
        if sid is None:  # the run's first schedule: the profiling one, never stored
            return PROFILING_SCHEDULE
        made = schedules.get(int(sid), "")
        return f"{made} (#{int(sid)})" if made else f"#{int(sid)}"

    rows = []
    for r in switches:
        gain, pct = _gain(r.get("predicted_before"), r.get("predicted_after"))
        to = r.get("to_schedule_id")
        rows.append(
            {
                "step": int(r["step"]),
                "kind": "switch",
                "what": f"{name(r.get('from_schedule_id'))} → {name(to)}",
                "gain": gain,
                "reason": r.get("reason") or "",
                "short": f"→ #{to}" + (f" ({pct})" if pct else ""),
            }
        )
    for r in calibrations:
        gain, pct = _gain(r.get("predicted_before"), r.get("predicted_after"))
        rows.append(
            {
                "step": int(r["step"]),
                "kind": "calibration",
                "what": name(r.get("schedule_id")),
                "gain": gain,
                "reason": r.get("reason") or "",
                "short": "calibrated" + (f" ({pct})" if pct else ""),
            }
        )
    df = pd.DataFrame(rows, columns=["step", "kind", "what", "gain", "reason", "short"])
    df = df.sort_values(["step", "kind"], kind="stable").reset_index(drop=True)
    return df.assign(label_y=label_rows(list(df["step"]), list(df["short"])))


def label_rows(
    steps: Sequence[float], texts: Sequence[str], *, width_px: float = CHART_WIDTH_PX
) -> list[int]:
    """The y (pixels from the top) of each label drawn at its step, so that no two overlap:
    each goes on the first row where the label before it has ended (steps ascending)."""
    if not steps:
        return []
    span = max(max(steps) - min(steps), 1.0)
    px_per_step = width_px / span
    ends: list[float] = []  # per row: the step where its last label ends
    out = []
    for step, text in zip(steps, texts, strict=True):
        length = (len(text) * LABEL_CHAR_PX + 8) / px_per_step
        row = next((i for i, end in enumerate(ends) if end <= step), len(ends))
        if row == len(ends):
            ends.append(step + length)
        else:
            ends[row] = step + length
        out.append(row * LABEL_LANE_PX)
    return out
