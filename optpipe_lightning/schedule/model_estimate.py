"""Analytic cost estimates: a ``Problem`` from a transformer's shape and a device kind.

Used by ``optpipe problem`` when no measured profile exists. Notation: ``s`` sequence length,
``b`` microbatch size, ``h`` hidden size, ``a`` attention heads, ``V`` vocabulary, ``e`` bytes per
activation element (2 for bf16/fp16, 4 for fp32).

Per transformer layer with eager attention and no recompute (Zero Bubble paper, Qi et al. ICLR
2024, Table 1, after Korthikanti et al. 2022; FLOPs count a multiply-add as 2):

=====  ==================  =================================================
op     FLOPs               activation memory change
=====  ==================  =================================================
F      ``sbh(24h + 4s)``   ``+M_B``, ``M_B = sb(34h + 5as) * e/2`` bytes
B      ``sbh(24h + 8s)``   ``-(M_B - M_W)``
W      ``24 s b h^2``      ``-M_W``, ``M_W = 32 sbh * e/2`` bytes
=====  ==================  =================================================

Attention (``attention``, default ``"flash"``) and recompute (``recompute``, default ``"none"``)
change it as today's training does:

- ``flash`` (FlashAttention): the ``5as^2 b`` term (attention scores, softmax, dropout mask:
  ``2 + 2 + 1`` bytes per score) is never stored, so ``M_B = 34 sbh * e/2``; its backward
  recomputes the scores ``QK^T`` from Q and K, ``+2 s^2 bh`` FLOPs on B (``sbh(24h + 10s)``).
- ``selective`` (Megatron's selective recompute): the attention core (scores, softmax, dropout,
  scores times V) is not stored but re-run in the backward: with eager attention ``M_B`` drops the
  ``5as^2 b`` term and B gains the core's forward, ``+4 s^2 bh`` FLOPs. With flash there is
  nothing left to drop: flash's own recompute is that already, so nothing changes.
- ``full`` (full activation recompute): F keeps only the layer input, ``I = sbh * e`` bytes; B
  first re-runs the layer's forward (``+ F`` FLOPs on B) and then, with B and W split, holds W's
  inputs ``M_W`` until W: ``m_f = I``, ``m_b = M_W - I`` (positive: memory grows at B's end),
  ``m_w = -M_W``. The re-run's own working set, one layer group's activation during its B, is
  transient and not counted against the limit.

with eager attention and no recompute ``T_B + T_W = 2 T_F`` and ``T_W < T_F < T_B``. The byte
counts are for 16-bit activations, fp32 doubles them (``e/2``). With ``vocab`` set, the LM head
sits on the last layer group: F, B and W each ``2sbhV`` FLOPs; it keeps its input (``sbh*e``, freed by W) and the fp32
logits for the loss (``4sbV``, freed by B). The embedding lookup costs no FLOPs worth counting and
keeps no activation here.

Layers are split over the ``p*v`` layer groups in model order, ``floor(L/G)`` each and one more
for the first ``L mod G`` groups (the last group, which may carry the LM head, gets the fewer).
A (stage, chunk) runs the layer group its placement gives it (``Problem.group_of``).

Times: ``T = FLOPs / (peak(dtype) * efficiency)``. p2p time ``t_comm = s*b*h*e / link``: the
hidden state handed to the next stage over the device link. Offload (``offload: true``) moves the
whole activation of one (stage, microbatch, chunk) (``bytes = m_f``) over the host copy link at
``copy`` bytes/s in each direction (``copy_bandwidth`` overrides the device's), both directions at
once (``offload.duplex``, where the problem format has it); ``stages_per_copy_channel``
consecutive stages share one channel (a PCIe switch: 2 = GPU pairs), 1 = a channel per stage.

``layers_per_stage`` (where the problem format has it): the layers each stage holds, written when
every chunk of a stage holds as many and no LM head sits on the last group, so that tools may
re-chunk the problem (``even_layers_per_stage``).

Device table (dense peaks, no sparsity; ``fp32`` is plain FP32, PyTorch's default for matmuls,
not TF32; ``efficiency`` defaults to 0.45, what the ZB paper's 1.5B measurement gives on A100:
F = 18.5 ms for 3 layers at h=2304, s=1024, b=6 is 136 TFLOP/s of 312):

=====  ===============  ===========  ==================  =======================
kind   bf16/fp16 peak   fp32 peak    link (p2p, bytes/s)  copy (host, bytes/s)
=====  ===============  ===========  ==================  =======================
h100   989e12           67e12        450e9 (NVLink 4)    50e9 (PCIe 5 x16)
h200   989e12           67e12        450e9 (NVLink 4)    50e9 (PCIe 5 x16)
a100   312e12           19.5e12      300e9 (NVLink 3)    25e9 (PCIe 4 x16)
cpu    1e12             1e12         5e9 (gloo, local)   10e9 (memcpy)
=====  ===============  ===========  ==================  =======================

(``cpu`` is a nominal 16-core AVX-512 host, efficiency 0.5.) Measured on one H200 (bf16, 2 GPT
layers, ``scaled_dot_product_attention``, b=1; BENCHMARKS.md "GPU check"): the forward implies
efficiency 0.74 at h=4096 s=4096 and 0.50 at h=2048 s=2048; at h=4096 F, B, W took 0.61, 0.74,
0.92 of their estimates at 0.45 (W, small matmuls, 2.57 at h=2048). The default stays 0.45 (the
shipped examples are built on it); pass ``efficiency`` for a measured device.

Memory limit: ``memory_limit`` in bytes per stage, or ``memory_limit_microbatches`` in units of
one microbatch's activation on the heaviest stage (``Problem.activation_unit()``, the sum of
``m_f`` over its chunks); not both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .problem import OffloadSpec, Problem

DType = Literal["bf16", "fp16", "fp32"]
DeviceKind = Literal["h100", "a100", "h200", "cpu"]
Attention = Literal["flash", "eager"]
Recompute = Literal["none", "selective", "full"]

BYTES_PER_ELEMENT: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class DeviceSpec:
    """Peak compute, default efficiency and link bandwidths of one device kind."""

    peak_16bit: float  # FLOP/s, bf16/fp16 dense tensor cores
    peak_fp32: float  # FLOP/s, plain FP32
    efficiency: float  # fraction of peak a transformer layer reaches
    link_bandwidth: float  # bytes/s to the next pipeline stage
    copy_bandwidth: float  # bytes/s device <-> host, each direction

    def peak(self, dtype: str) -> float:
        return self.peak_fp32 if dtype == "fp32" else self.peak_16bit


DEVICES: dict[str, DeviceSpec] = {
    "h100": DeviceSpec(989e12, 67e12, 0.45, 450e9, 50e9),
    "h200": DeviceSpec(989e12, 67e12, 0.45, 450e9, 50e9),
    "a100": DeviceSpec(312e12, 19.5e12, 0.45, 300e9, 25e9),
    "cpu": DeviceSpec(1e12, 1e12, 0.5, 5e9, 10e9),
}


class ModelSpec(BaseModel):
    """A transformer's shape, the device it runs on, and the pipeline to plan."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: int = Field(ge=1, description="transformer layers (L)")
    hidden: int = Field(ge=1, description="hidden size (h)")
    heads: int = Field(ge=1, description="attention heads (a)")
    seq_len: int = Field(ge=1, description="sequence length (s)")
    microbatch_size: int = Field(ge=1, description="sequences per microbatch (b)")
    vocab: int | None = Field(default=None, ge=1, description="vocabulary; adds the LM head")
    dtype: DType = "bf16"
    device: DeviceKind = "h100"
    efficiency: float | None = Field(
        default=None, gt=0, le=1, description="fraction of peak FLOP/s (default: the device's)"
    )
    link_bandwidth: float | None = Field(
        default=None, gt=0, description="p2p bytes/s (default: the device's)"
    )
    num_stages: int = Field(ge=1)
    num_microbatches: int = Field(ge=1)
    num_chunks: int = Field(default=1, ge=1)
    placement: Literal["interleaved", "vshape"] = "interleaved"
    memory_limit: float | None = Field(default=None, gt=0, description="bytes per stage")
    memory_limit_microbatches: float | None = Field(
        default=None, gt=0, description="per stage, in microbatch activations of the heaviest stage"
    )
    offload: bool = False
    copy_bandwidth: float | None = Field(
        default=None, gt=0, description="host copy bytes/s per direction (default: the device's)"
    )
    stages_per_copy_channel: int = Field(default=1, ge=1)
    attention: Attention = "flash"
    recompute: Recompute = "none"
    name: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        groups = self.num_stages * self.num_chunks
        if self.layers < groups:
            raise ValueError(
                f"layers={self.layers} is fewer than num_stages*num_chunks={groups} layer groups "
                "(every group needs at least one layer)"
            )
        if self.memory_limit is not None and self.memory_limit_microbatches is not None:
            raise ValueError("give memory_limit (bytes) or memory_limit_microbatches, not both")
        return self


@dataclass(frozen=True)
class LayerCosts:
    """FLOPs and activation bytes of one transformer layer for one microbatch."""

    flops_f: float
    flops_b: float
    flops_w: float
    bytes_b: float  # what F allocates (M_B; the layer input under full recompute)
    bytes_w: float  # M_W: what W frees (B frees bytes_b - M_W; under full recompute it adds)


def layer_costs(spec: ModelSpec) -> LayerCosts:
    """One layer's FLOPs and activation bytes under the spec's attention and recompute (see the
    module docstring)."""
    s, b, h, a = spec.seq_len, spec.microbatch_size, spec.hidden, spec.heads
    scale = BYTES_PER_ELEMENT[spec.dtype] / 2
    sbh = float(s * b * h)
    flops_f = sbh * (24 * h + 4 * s)
    flops_b = sbh * (24 * h + 8 * s)
    flops_w = 24.0 * sbh * h
    scores = float(s * b) * 5 * a * s * scale  # attention scores, softmax, dropout mask
    kept = float(s * b) * 34 * h * scale
    if spec.attention == "flash":
        flops_b += 2.0 * sbh * s  # the backward recomputes QK^T
    elif spec.recompute == "selective":
        flops_b += 4.0 * sbh * s  # the attention core's forward, again
    else:
        kept += scores
    bytes_w = 32.0 * sbh * scale
    if spec.recompute == "full":
        flops_b += flops_f
        kept = sbh * BYTES_PER_ELEMENT[spec.dtype]  # the layer input only
    return LayerCosts(
        flops_f=flops_f, flops_b=flops_b, flops_w=flops_w, bytes_b=kept, bytes_w=bytes_w
    )


def layers_per_group(layers: int, groups: int) -> list[int]:
    """Layers of each layer group in model order: the first ``layers % groups`` get one more."""
    base, extra = divmod(layers, groups)
    return [base + (1 if g < extra else 0) for g in range(groups)]


def estimate_problem(spec: ModelSpec) -> Problem:
    """The problem (costs, memory, offload) a model shape implies on a device kind."""
    dev = DEVICES[spec.device]
    p, v = spec.num_stages, spec.num_chunks
    e = BYTES_PER_ELEMENT[spec.dtype]
    speed = dev.peak(spec.dtype) * (spec.efficiency or dev.efficiency)
    lc = layer_costs(spec)
    counts = layers_per_group(spec.layers, p * v)
    s, b, h = spec.seq_len, spec.microbatch_size, spec.hidden

    def group_of(stage: int, chunk: int) -> int:
        if v == 1:
            return stage
        if spec.placement == "interleaved" or chunk % 2 == 0:
            return chunk * p + stage
        return (chunk + 1) * p - 1 - stage

    t_f, t_b, t_w, m_f, m_b, m_w = ([[0.0] * v for _ in range(p)] for _ in range(6))
    for st in range(p):
        for c in range(v):
            g = group_of(st, c)
            n = counts[g]
            ff, fb, fw = n * lc.flops_f, n * lc.flops_b, n * lc.flops_w
            alloc, free_w = n * lc.bytes_b, n * lc.bytes_w
            if spec.vocab is not None and g == p * v - 1:
                head = 2.0 * s * b * h * spec.vocab
                ff, fb, fw = ff + head, fb + head, fw + head
                alloc += float(s * b * h * e) + 4.0 * s * b * spec.vocab
                free_w += float(s * b * h * e)
            t_f[st][c], t_b[st][c], t_w[st][c] = ff / speed, fb / speed, fw / speed
            m_f[st][c], m_b[st][c], m_w[st][c] = alloc, -(alloc - free_w), -free_w
    t_comm = float(s * b * h * e) / (spec.link_bandwidth or dev.link_bandwidth)
    offload = None
    if spec.offload:
        k = spec.stages_per_copy_channel
        copy = spec.copy_bandwidth or dev.copy_bandwidth
        offload_fields: dict[str, object] = {
            "bytes": [row[:] for row in m_f],
            "d2h_bandwidth": copy,
            "h2d_bandwidth": copy,
            "channel_groups": [list(range(lo, min(lo + k, p))) for lo in range(0, p, k)]
            if k > 1
            else [],
        }
        if "duplex" in OffloadSpec.model_fields:  # GPUs copy each way on its own engine
            offload_fields["duplex"] = True
        offload = OffloadSpec.model_validate(offload_fields)
    unit = max(sum(row) for row in m_f)
    limit = spec.memory_limit
    if spec.memory_limit_microbatches is not None:
        limit = spec.memory_limit_microbatches * unit
    name = spec.name or (
        f"estimate: L={spec.layers} h={h} a={spec.heads} s={s} b={b}"
        + (f" V={spec.vocab}" if spec.vocab else "")
        + f" {spec.dtype} on {spec.device} (eff {spec.efficiency or dev.efficiency:g})"
        + f", {spec.attention} attention"
        + ("" if spec.recompute == "none" else f", {spec.recompute} recompute")
    )
    fields: dict[str, object] = {
        "num_stages": p,
        "num_microbatches": spec.num_microbatches,
        "num_chunks": v,
        "placement": spec.placement,
        "t_f": t_f,
        "t_b": t_b,
        "t_w": t_w,
        "t_comm": t_comm,
        "m_f": m_f,
        "m_b": m_b,
        "m_w": m_w,
        "memory_limit": limit,
        "offload": offload,
        "name": name,
    }
    per_stage = even_layers_per_stage(spec)
    if per_stage is not None and "layers_per_stage" in Problem.model_fields:
        fields["layers_per_stage"] = per_stage
    return Problem.model_validate(fields)


def even_layers_per_stage(spec: ModelSpec) -> int | list[int] | None:
    """The layers each stage holds, one number when all stages hold the same, when the problem
    may be re-chunked: every chunk of a stage holds as many layers and no LM head makes the last
    group heavier. None otherwise."""
    p, v = spec.num_stages, spec.num_chunks
    if spec.vocab is not None or (v > 1 and spec.layers % (p * v)):
        return None
    counts = layers_per_group(spec.layers, p) if v == 1 else [spec.layers // p] * p
    return counts[0] if len(set(counts)) == 1 else counts
