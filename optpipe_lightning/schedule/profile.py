"""Measured profiles and the fingerprints they are stored under (JSON formats, pydantic).

A ``Profile`` is what the strategy's profiler measures on this hardware for this model: per
(stage, chunk) op times with their spread, activation bytes, copy bandwidths and p2p time.
``Profile.to_problem`` turns it into a ``Problem`` for the solver.

Memory per (stage, chunk): where the profile carries what the CUDA allocator measured around each
op (``StageProfile.memory``, the strategy's profiler on GPU), the problem's ``m_f``, ``m_b``,
``m_w`` are those bytes (``m_b`` may be positive: torch's input-gradient pass allocates the
gradients its weight-gradient pass needs); else (CPU, older profiles) the rule: F allocates
``activation_bytes``, B frees all but ``weight_grad_bytes``, W frees those. The transient above
that (``OpMemory.transient``) is not an event of the model: ``Profile.memory_reserve`` gives it
per stage, for whoever sets the memory limit (the strategy subtracts it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from .problem import OffloadSpec, Problem

PROFILE_FORMAT: Final = "optpipe.profile/1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _digest(model: BaseModel) -> str:
    text = json.dumps(model.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class HardwareFingerprint(_Strict):
    """What makes measured times on one machine comparable to another's."""

    device_kind: str = Field(description="e.g. 'NVIDIA H100 80GB HBM3' or 'cpu'")
    device_count: int = Field(ge=1)
    device_memory: int = Field(ge=0, description="bytes per device (0 for CPU)")
    interconnect: str = Field(default="unknown", description="e.g. 'nvlink', 'pcie', 'gloo-tcp'")
    driver: str = ""
    torch_version: str = ""
    hostname: str | None = Field(default=None, description="informative; not part of the key")

    @property
    def key(self) -> str:
        return _digest(self.model_copy(update={"hostname": None}))


class ModelFingerprint(_Strict):
    """What makes two models cost the same per stage."""

    name: str = ""
    layer_structure: list[str] = Field(description="class name of each pipelined layer, in order")
    parameter_shapes: list[list[int]] = Field(default_factory=list)
    dtype: str = "float32"
    microbatch_size: int = Field(ge=1)
    sequence_length: int | None = None
    num_stages: int = Field(ge=1)
    num_chunks: int = Field(default=1, ge=1)
    partition: list[int] = Field(
        default_factory=list, description="number of layers in each layer group"
    )
    placement: Literal["interleaved", "vshape"] | None = Field(
        default=None,
        description="how a device's chunks sit in the model (with num_chunks and partition it "
        "selects the schedule family); None: a fingerprint written before it was recorded",
    )

    @property
    def key(self) -> str:
        data = self.model_copy(update={"name": ""}).model_dump(mode="json")
        if data["placement"] is None:  # the key such a fingerprint always had
            del data["placement"]
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class OpStats(_Strict):
    """Measured seconds of one op kind on one (stage, chunk): mean, spread and sample count."""

    mean: float = Field(gt=0)
    std: float = Field(default=0.0, ge=0)
    min: float | None = None
    max: float | None = None
    samples: int = Field(default=1, ge=1)


class OpMemory(_Strict):
    """Bytes one (stage, chunk)'s ops leave allocated, measured by the CUDA caching allocator
    (signed; the median over the profiling steps), and the largest transient above that."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    f: float = Field(description="what an F leaves allocated (its activation, output, loss)")
    b: float = Field(description="what a B (input gradient) leaves: > 0 when it keeps gradients")
    w: float = Field(description="what a W leaves (as measured; the problem uses -(f + b))")
    bw: float | None = Field(default=None, description="what a fused BW leaves")
    transient: float = Field(
        default=0.0, ge=0, description="largest rise of any op above both its ends (workspace)"
    )
    samples: int = Field(default=1, ge=1, description="samples of the least-sampled op kind")

    def changes(self) -> tuple[float, float, float]:
        """(m_f, m_b, m_w) of the problem: F's at least 0, B's as measured, W frees the rest."""
        m_f = max(0.0, self.f)
        return m_f, self.b, -(m_f + self.b)


class StageProfile(_Strict):
    stage: int = Field(ge=0)
    chunk: int = Field(default=0, ge=0)
    f: OpStats
    b: OpStats
    w: OpStats
    bw: OpStats | None = Field(default=None, description="fused backward (B and W as one op)")
    activation_bytes: float = Field(ge=0, description="bytes an F leaves for its B and W")
    weight_grad_bytes: float = Field(
        default=0.0, ge=0, description="part of activation_bytes that only W frees"
    )
    offloadable_bytes: float | None = Field(
        default=None, ge=0, description="bytes an offload moves (default: activation_bytes)"
    )
    memory: OpMemory | None = Field(
        default=None,
        description="per-op bytes the allocator measured (GPU); when given, m_f/m_b/m_w follow "
        "it instead of activation_bytes and weight_grad_bytes",
    )

    def memory_changes(self) -> tuple[float, float, float]:
        """(m_f, m_b, m_w) of this (stage, chunk): measured where ``memory`` is given (F's at
        least 0; W frees what F and B left), else the rule (module doc)."""
        if self.memory is not None:
            return self.memory.changes()
        act, wg = self.activation_bytes, self.weight_grad_bytes
        return act, -(act - wg), -wg

    def offload_bytes(self) -> float:
        """Bytes an offload moves: at most what F leaves allocated."""
        off = (
            self.offloadable_bytes if self.offloadable_bytes is not None else self.activation_bytes
        )
        return min(off, self.memory_changes()[0])


class Profile(_Strict):
    format: Literal["optpipe.profile/1"] = PROFILE_FORMAT
    hardware: HardwareFingerprint
    model: ModelFingerprint
    num_microbatches: int = Field(ge=1)
    placement: Literal["interleaved", "vshape"] = "interleaved"
    stages: list[StageProfile]
    p2p_seconds: float = Field(default=0.0, ge=0)
    d2h_bandwidth: float | None = Field(default=None, gt=0)
    h2d_bandwidth: float | None = Field(default=None, gt=0)
    channel_groups: list[list[int]] = Field(default_factory=list)
    measured_at: str | None = Field(default=None, description="ISO-8601 time of measurement")
    runtime_overhead: float = Field(
        default=0.0,
        ge=0,
        description="seconds of runtime overhead per compute action already included in every "
        "F, B, W and BW mean (the strategy's fit to the profiling steps; 0: none or unknown)",
    )

    def memory_reserve(self) -> list[float]:
        """Bytes per stage the memory model does not see: the largest transient of any op of
        the stage's chunks (0 where the profile has no measured memory)."""
        out = [0.0] * self.model.num_stages
        for sp in self.stages:
            if sp.memory is not None and sp.stage < len(out):
                out[sp.stage] = max(out[sp.stage], sp.memory.transient)
        return out

    def to_problem(self, memory_limit: float | list[float] | None = None) -> Problem:
        """The problem these measurements define (offload allowed when bandwidths are known)."""
        p, v = self.model.num_stages, self.model.num_chunks
        grid: dict[tuple[int, int], StageProfile] = {(sp.stage, sp.chunk): sp for sp in self.stages}
        missing = [(s, c) for s in range(p) for c in range(v) if (s, c) not in grid]
        if missing:
            raise ValueError(f"profile has no measurements for (stage, chunk) {missing[:4]}")

        def field(fn: Callable[[StageProfile], float]) -> list[list[float]]:
            return [[float(fn(grid[s, c])) for c in range(v)] for s in range(p)]

        offload = None
        if self.d2h_bandwidth and self.h2d_bandwidth:
            offload = OffloadSpec(
                bytes=field(lambda x: x.offload_bytes()),
                d2h_bandwidth=self.d2h_bandwidth,
                h2d_bandwidth=self.h2d_bandwidth,
                channel_groups=self.channel_groups,
            )
        return Problem(
            num_stages=p,
            num_microbatches=self.num_microbatches,
            num_chunks=v,
            placement=self.placement,
            t_f=field(lambda x: x.f.mean),
            t_b=field(lambda x: x.b.mean),
            t_w=field(lambda x: x.w.mean),
            t_bw=field(lambda x: x.bw.mean if x.bw else x.b.mean + x.w.mean)
            if any(sp.bw is not None for sp in self.stages)
            else None,
            t_comm=self.p2p_seconds,
            m_f=field(lambda x: x.memory_changes()[0]),
            m_b=field(lambda x: x.memory_changes()[1]),
            m_w=field(lambda x: x.memory_changes()[2]),
            memory_limit=memory_limit,
            offload=offload,
            name=self.model.name or None,
        )
