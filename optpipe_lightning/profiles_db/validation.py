"""What the database checks before it stores anything, and what the strategy asks before it
trusts a stored profile.

- ``profile_defect(profile)``: why a profile cannot serve the model it claims (a (stage, chunk)
  of the model it does not measure, one it measures twice or that the model does not have, a
  partition that does not match the layers, measurements outside the problem format's ranges,
  a value too large for its column), or None. ``store_profile`` refuses a defective profile;
  ``find_profile`` skips one with a warning; the strategy calls it on any profile it is handed.
- ``evaluation_mismatch(claimed, actual)``: where a schedule's claimed evaluation differs from
  the simulator's (``store_schedule`` never trusts a claim: it stores the simulator's, and
  refuses a schedule whose claim disagrees, which is how ``db import`` refuses a forged one).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import BigInteger, Integer, String

from optpipe_lightning.schedule.profile import Profile
from optpipe_lightning.schedule.ranges import MAX_CHUNKS, MAX_MICROBATCHES, MAX_STAGES
from optpipe_lightning.schedule.schedule import Evaluation
from optpipe_lightning.schedule.units import distinct

from .models import Base, HardwareRecord, ModelRecord

_INT32 = 2**31 - 1
_INT64 = 2**63 - 1


def column_defect(record: type[Base], values: dict[str, Any]) -> str | None:
    """Why a value does not fit its column of ``record``'s table (too long, too large)."""
    table = record.__table__
    for name, value in values.items():
        col = table.columns[name]
        if isinstance(col.type, String) and isinstance(value, str):
            limit = col.type.length
            if limit is not None and len(value) > limit:
                return f"{name} is {len(value)} characters long; at most {limit} are stored"
        elif isinstance(col.type, Integer) and isinstance(value, int):
            top = _INT64 if isinstance(col.type, BigInteger) else _INT32
            if not -top - 1 <= value <= top:
                return f"{name} {value} does not fit in a {col.type} column (at most {top})"
    return None


def profile_defect(profile: Profile) -> str | None:
    """Why ``profile`` cannot serve the model it claims, or None when it can.

    Cheap (no larger than the profile itself): sizes are checked before anything is built.
    """
    model, hw = profile.model, profile.hardware
    p, v = model.num_stages, model.num_chunks
    if p > MAX_STAGES or v > MAX_CHUNKS:
        return f"its model has {p} stages x {v} chunks; at most {MAX_STAGES} x {MAX_CHUNKS}"
    if profile.num_microbatches > MAX_MICROBATCHES:
        return f"num_microbatches {profile.num_microbatches} is above {MAX_MICROBATCHES}"
    if model.placement is not None and model.placement != profile.placement:
        return (
            f"it measures the {profile.placement!r} placement, but its model fingerprint "
            f"says {model.placement!r}"
        )
    seen: set[tuple[int, int]] = set()
    for sp in profile.stages:
        key = (sp.stage, sp.chunk)
        if sp.stage >= p or sp.chunk >= v:
            return (
                f"it measures (stage {sp.stage}, chunk {sp.chunk}), but its model has "
                f"{p} stages x {v} chunks"
            )
        if key in seen:
            return f"it measures (stage {sp.stage}, chunk {sp.chunk}) twice"
        seen.add(key)
    missing = [(s, c) for s in range(p) for c in range(v) if (s, c) not in seen]
    if missing:
        shown = ", ".join(f"(stage {s}, chunk {c})" for s, c in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return (
            f"its model has {p} stages x {v} chunks, but it has no measurements for {shown}{more}"
        )
    if model.partition:
        if len(model.partition) != p * v:
            return (
                f"its model's partition has {len(model.partition)} layer groups, "
                f"expected stages x chunks = {p * v}"
            )
        if any(n < 1 for n in model.partition):
            return "its model's partition has a layer group without layers"
        if model.layer_structure and sum(model.partition) != len(model.layer_structure):
            return (
                f"its model's partition holds {sum(model.partition)} layers, but the model "
                f"has {len(model.layer_structure)}"
            )
    for label, record, values in (
        (
            "hardware",
            HardwareRecord,
            {
                "device_kind": hw.device_kind,
                "device_count": hw.device_count,
                "device_memory": hw.device_memory,
                "interconnect": hw.interconnect,
                "driver": hw.driver,
                "torch_version": hw.torch_version,
            },
        ),
        (
            "model",
            ModelRecord,
            {
                "name": model.name,
                "dtype": model.dtype,
                "microbatch_size": model.microbatch_size,
                "sequence_length": model.sequence_length,
                "num_stages": p,
                "num_chunks": v,
            },
        ),
    ):
        found = column_defect(record, values)
        if found is not None:
            return f"its {label} {found}"
    if profile.measured_at is not None:
        try:
            datetime.fromisoformat(profile.measured_at)
        except ValueError:
            return f"measured_at {profile.measured_at[:40]!r} is not an ISO-8601 time"
    try:
        profile.to_problem()
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        msg = str(first["msg"]).removeprefix("Value error, ")
        return f"its measurements make no valid problem: {msg}"
    except ValueError as e:
        return f"its measurements make no valid problem: {e}"
    return None


def _differs(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is not b
    return not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def evaluation_mismatch(claimed: Evaluation, actual: Evaluation) -> str | None:
    """Where ``claimed`` says other than the simulator's ``actual`` evaluation, or None."""

    def fmt(x: float | None) -> str:
        return "none" if x is None else f"{x:.6g}"

    if claimed.feasible != actual.feasible:
        why = f" ({actual.violations[0].kind})" if actual.violations else ""
        return (
            f"it claims feasible={str(claimed.feasible).lower()}, but the simulator finds it "
            f"{'feasible' if actual.feasible else 'infeasible' + why}"
        )
    if _differs(claimed.makespan, actual.makespan):
        said, found = fmt(claimed.makespan), fmt(actual.makespan)
        if claimed.makespan is not None and actual.makespan is not None:
            said, found = distinct(claimed.makespan, actual.makespan)
        return f"it claims makespan {said}, but the simulator times it at {found}"
    if claimed.peak_memory and (
        len(claimed.peak_memory) != len(actual.peak_memory)
        or any(_differs(a, b) for a, b in zip(claimed.peak_memory, actual.peak_memory, strict=True))
    ):
        return "its claimed peak memory differs from the simulator's"
    if claimed.num_offloaded != actual.num_offloaded:
        return f"it claims {claimed.num_offloaded} offloads, but it has {actual.num_offloaded}"
    return None
