"""The problem format (``optpipe.problem/1``): the measured costs a schedule is built for.

Units are seconds and bytes. A per-stage field takes one number (all stages and chunks), a list
of ``num_stages`` numbers (every chunk of that stage), or a list of lists ``[stage][chunk]``.
Unknown fields are an error. ``Problem.cost(name)`` gives any per-stage field as a
``num_stages x num_chunks`` numpy array; ``Problem.hash`` is stable under the spelling of those
fields (a scalar and the list it expands to hash the same).
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Annotated, Any, Final, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .ranges import (
    MAX_BYTES,
    MAX_SECONDS,
    MIN_BYTES,
    MIN_SECONDS,
    Bandwidth,
    Chunks,
    Count,
    Label,
    Microbatches,
    Number,
    StageIndex,
    Stages,
    bytes_problem,
    time_problem,
)
from .units import format_bytes

PROBLEM_FORMAT: Final = "optpipe.problem/1"

Layers = Annotated[Count, Field(le=1_000_000)]

PerStage = Number | list[Number] | list[list[Number]]

COST_FIELDS = ("t_f", "t_b", "t_w", "t_comm", "m_f", "m_b", "m_w")


def expand_per_stage(value: PerStage, num_stages: int, num_chunks: int, name: str) -> np.ndarray:
    """Expand a per-stage field to a ``[stage][chunk]`` float array, naming the field on error."""
    if isinstance(value, int | float):
        return np.full((num_stages, num_chunks), float(value))
    assert isinstance(value, list)
    if len(value) != num_stages:
        raise ValueError(
            f"{name} has {len(value)} entries, expected num_stages={num_stages} "
            "(or give one number for all stages)"
        )
    rows = []
    row: Any
    for s, row in enumerate(value):
        if isinstance(row, int | float):
            rows.append([float(row)] * num_chunks)
        else:
            if len(row) != num_chunks:
                raise ValueError(
                    f"{name}[{s}] has {len(row)} entries, expected num_chunks={num_chunks}"
                )
            rows.append([float(x) for x in row])
    return np.asarray(rows, dtype=float)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OffloadSpec(_Strict):
    """What one (stage, microbatch, chunk) activation offload moves, and over which channel."""

    bytes: PerStage = Field(description="bytes one (stage, microbatch, chunk) moves to the host")
    d2h_bandwidth: Bandwidth = Field(description="device-to-host copy bandwidth, bytes/s")
    h2d_bandwidth: Bandwidth = Field(description="host-to-device copy bandwidth, bytes/s")
    channel_groups: list[list[StageIndex]] = Field(
        default_factory=list,
        description="stages sharing one copy channel (a PCIe switch); others have their own",
    )
    duplex: bool = Field(
        default=True,
        description="a channel copies each way at once (a device-to-host and a host-to-device "
        "lane, each one transfer at a time); false: one lane for both directions",
    )


class Problem(_Strict):
    """A pipeline schedule problem: costs of this model on this hardware plus a memory limit."""

    format: Literal["optpipe.problem/1"] = PROBLEM_FORMAT
    num_stages: Stages = Field(description="devices in the pipeline (p)")
    num_microbatches: Microbatches = Field(description="microbatches per iteration (m)")
    num_chunks: Chunks = Field(default=1, description="chunks (virtual stages) per device (v)")
    placement: Literal["interleaved", "vshape"] = "interleaved"
    t_f: PerStage
    t_b: PerStage
    t_w: PerStage
    t_bw: PerStage | None = Field(
        default=None,
        description="seconds of a fused backward (B and W as one op, 'BW'); default t_b + t_w",
    )
    t_comm: PerStage = 0.0
    m_f: PerStage = 1.0
    m_b: PerStage = -0.5
    m_w: PerStage = -0.5
    memory_limit: Number | list[Number] | None = None
    offload: OffloadSpec | None = None
    layers_per_stage: Layers | list[Layers] | None = Field(
        default=None,
        description="equal layers each stage holds (one number or a list per stage): tools may "
        "split a stage into any chunk count dividing them (``schedule.chunking``)",
    )
    name: Label | None = Field(default=None, description="free-form label, not part of the hash")

    @model_validator(mode="after")
    def _check(self) -> Problem:
        p, v = self.num_stages, self.num_chunks
        arrays = {name: expand_per_stage(getattr(self, name), p, v, name) for name in COST_FIELDS}
        if self.t_bw is not None:
            arrays["t_bw"] = expand_per_stage(self.t_bw, p, v, "t_bw")
        for name in ("t_f", "t_b", "t_bw", "t_w", "t_comm"):
            if name in arrays:
                _check_times(name, arrays[name], positive=name in ("t_f", "t_b", "t_bw"))
        for name in ("m_f", "m_b", "m_w"):
            _check_bytes(name, arrays[name], signed=True)
        if np.any(arrays["m_f"] < 0):
            raise ValueError("m_f must be >= 0 bytes (a forward allocates its activation)")
        total = arrays["m_f"] + arrays["m_b"] + arrays["m_w"]
        scale = np.maximum(np.abs(arrays["m_f"]), 1.0)
        if np.any(np.abs(total) > 1e-6 * scale):
            s, c = np.argwhere(np.abs(total) > 1e-6 * scale)[0]
            raise ValueError(
                f"m_f + m_b + m_w must sum to 0 (what F allocates, B and W free); "
                f"stage {s} chunk {c} sums to {format_bytes(float(total[s, c]))}"
            )
        if self.memory_limit is not None:
            lim = self.memory_limit
            lims = [lim] * p if isinstance(lim, int | float) else lim
            if len(lims) != p:
                raise ValueError(f"memory_limit has {len(lims)} entries, expected num_stages={p}")
            if any(x <= 0 for x in lims):
                raise ValueError("memory_limit must be > 0 bytes (or null for unlimited)")
            _check_bytes("memory_limit", np.asarray(lims, dtype=float)[:, None])
        if self.offload is not None:
            b = expand_per_stage(self.offload.bytes, p, v, "offload.bytes")
            if np.any(b < 0):
                raise ValueError("offload.bytes must be >= 0")
            _check_bytes("offload.bytes", b)
            for bw, name in (
                (self.offload.d2h_bandwidth, "d2h"),
                (self.offload.h2d_bandwidth, "h2d"),
            ):
                _check_times(f"a copy's offload.bytes / offload.{name}_bandwidth", b / bw)
            if np.any(b > arrays["m_f"] * (1 + 1e-9)):
                raise ValueError("offload.bytes must not exceed m_f (only an activation can move)")
            seen: set[int] = set()
            for g in self.offload.channel_groups:
                for s in g:
                    if not 0 <= s < p:
                        raise ValueError(
                            f"offload.channel_groups names stage {s}; stages are 0..{p - 1}"
                        )
                    if s in seen:
                        raise ValueError(f"offload.channel_groups names stage {s} twice")
                    seen.add(s)
        self._check_layers()
        return self

    def _check_layers(self) -> None:
        lay = self.layers_per_stage
        if lay is None:
            return
        p, v = self.num_stages, self.num_chunks
        layers = [lay] * p if isinstance(lay, int) else lay
        if len(layers) != p:
            raise ValueError(
                f"layers_per_stage has {len(layers)} entries, expected num_stages={p} "
                "(or give one number for all stages)"
            )
        if any(x < 1 for x in layers):
            raise ValueError("layers_per_stage must be whole numbers >= 1 (layers on each stage)")
        for s, n in enumerate(layers):
            if n % v:
                raise ValueError(
                    f"layers_per_stage: num_chunks={v} does not divide the {n} layers of stage "
                    f"{s}; give a num_chunks that divides every stage's layers, or other layers"
                )

    # ---- derived views -------------------------------------------------------------------

    def cost(self, name: str) -> np.ndarray:
        """A per-stage field as a ``[stage][chunk]`` float array (read-only).

        Also ``"t_bw"`` (the fused backward, ``t_b + t_w`` unless given) and ``"offload_bytes"``.
        """
        return self._arrays[name]

    @cached_property
    def _arrays(self) -> dict[str, np.ndarray]:
        p, v = self.num_stages, self.num_chunks
        out = {n: expand_per_stage(getattr(self, n), p, v, n) for n in COST_FIELDS}
        out["t_bw"] = (
            out["t_b"] + out["t_w"]
            if self.t_bw is None
            else expand_per_stage(self.t_bw, p, v, "t_bw")
        )
        if self.offload is not None:
            out["offload_bytes"] = expand_per_stage(self.offload.bytes, p, v, "offload.bytes")
        else:
            out["offload_bytes"] = np.zeros((p, v))
        for a in out.values():
            a.setflags(write=False)
        return out

    def layers(self) -> list[int] | None:
        """``layers_per_stage`` as one count per stage (None when not given)."""
        lay = self.layers_per_stage
        if lay is None:
            return None
        return [lay] * self.num_stages if isinstance(lay, int) else list(lay)

    @property
    def num_virtual_stages(self) -> int:
        return self.num_stages * self.num_chunks

    def memory_limits(self) -> list[float | None]:
        """The activation-memory limit of each stage (None = unlimited)."""
        lim = self.memory_limit
        if lim is None:
            return [None] * self.num_stages
        if isinstance(lim, int | float):
            return [float(lim)] * self.num_stages
        return [float(x) for x in lim]

    def channel_of(self) -> list[int]:
        """The copy channel of each stage: stages of one channel group share an id."""
        chan = list(range(self.num_stages))
        if self.offload is not None:
            for g in self.offload.channel_groups:
                if g:
                    head = min(g)
                    for s in g:
                        chan[s] = head
        return chan

    def offload_time(self, stage: int, chunk: int) -> float:
        """Seconds one device-to-host copy of that (stage, chunk) activation takes."""
        if self.offload is None:
            return 0.0
        return float(self._arrays["offload_bytes"][stage, chunk]) / self.offload.d2h_bandwidth

    def reload_time(self, stage: int, chunk: int) -> float:
        """Seconds one host-to-device copy of that (stage, chunk) activation takes."""
        if self.offload is None:
            return 0.0
        return float(self._arrays["offload_bytes"][stage, chunk]) / self.offload.h2d_bandwidth

    def group_of(self, stage: int, chunk: int) -> int:
        """The layer group (position in the model, 0 = first) that (stage, chunk) runs."""
        p = self.num_stages
        if self.num_chunks == 1:
            return stage
        if self.placement == "interleaved" or chunk % 2 == 0:
            return chunk * p + stage
        return (chunk + 1) * p - 1 - stage

    @cached_property
    def group_table(self) -> list[tuple[int, int]]:
        """``group_table[g] = (stage, chunk)``: which device and chunk run layer group g."""
        table: list[tuple[int, int]] = [(0, 0)] * self.num_virtual_stages
        for s in range(self.num_stages):
            for c in range(self.num_chunks):
                table[self.group_of(s, c)] = (s, c)
        return table

    @cached_property
    def hash(self) -> str:
        """A stable hash of everything that defines the problem (not its name or spelling)."""
        canon = {
            "format": self.format,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "num_chunks": self.num_chunks,
            "placement": self.placement if self.num_chunks > 1 else "interleaved",
            **{n: self._arrays[n].tolist() for n in COST_FIELDS},
            # only when given, so problems without it keep their hash
            **({"t_bw": self._arrays["t_bw"].tolist()} if self.t_bw is not None else {}),
            "memory_limit": self.memory_limits(),
            # only when given, so problems without it keep their hash
            **({"layers_per_stage": self.layers()} if self.layers_per_stage is not None else {}),
            "offload": None
            if self.offload is None
            else {
                "bytes": self._arrays["offload_bytes"].tolist(),
                "d2h_bandwidth": float(self.offload.d2h_bandwidth),
                "h2d_bandwidth": float(self.offload.h2d_bandwidth),
                "channel_groups": sorted(sorted(g) for g in self.offload.channel_groups if g),
                "duplex": self.offload.duplex,
            },
        }
        text = json.dumps(canon, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def with_changes(self, **changes: object) -> Problem:
        """A copy with some fields replaced, validated again."""
        data = self.model_dump()
        data.update(changes)
        return Problem.model_validate(data)

    def activation_unit(self) -> float:
        """Bytes of one microbatch's activation on the heaviest stage (sum over its chunks)."""
        return float(self._arrays["m_f"].sum(axis=1).max())


def _first_bad(name: str, values: np.ndarray, bad: np.ndarray) -> tuple[str, float]:
    """The field spelled at its first bad (stage, chunk), and the value there."""
    s, c = (int(x) for x in np.argwhere(bad)[0])
    uniform = bool(np.all(values == values.flat[0]))
    where = name if uniform else f"{name} at stage {s} chunk {c}"
    return where, float(values[s, c])


def _check_times(name: str, values: np.ndarray, *, positive: bool = False) -> None:
    """Every time 0 (unless ``positive``) or within [MIN_SECONDS, MAX_SECONDS]."""
    ok = (values >= MIN_SECONDS) & (values <= MAX_SECONDS)
    if not positive:
        ok |= values == 0
    if not ok.all():
        where, x = _first_bad(name, values, ~ok)
        message = time_problem(where, x, positive=positive)
        raise ValueError(message or f"{where} is out of range, got {x:g}")


def _check_bytes(name: str, values: np.ndarray, *, signed: bool = False) -> None:
    """Every byte count 0 or of a magnitude within [MIN_BYTES, MAX_BYTES]."""
    mag = np.abs(values)
    ok = (values == 0) | ((mag >= MIN_BYTES) & (mag <= MAX_BYTES))
    if not ok.all():
        where, x = _first_bad(name, values, ~ok)
        raise ValueError(bytes_problem(where, x, signed=signed) or f"{where} is out of range")
