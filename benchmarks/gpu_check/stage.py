"""The transformer-layer sections of ``benchmarks/gpu_check``.

- ``op_costs``: F, B, W and fused BW of a GPT layer group (pre-LayerNorm, causal attention
  through ``scaled_dot_product_attention``, 4h GELU MLP, no dropout), timed by the executor's own
  cursor (CUDA events on GPU) while torch's runtime runs them with its split backward, against
  what ``optpipe problem`` estimates for the same layers (``schedule.model_estimate``); and the
  bytes one microbatch's forward saves (saved-tensor hooks) and allocates (the CUDA allocator),
  against the estimate's activation bytes; and what each op leaves allocated and its transient,
  as the strategy's profiler measures them (the cursor's allocator watch, ``op_memory``).
- the harness both use: layer group 0 (``Scale``) hands a made-up input to the GPT layers under
  test (group 1), on one device in one process, with a made-up incoming gradient.

Section 4 (one stage's schedule) is ``schedule.py``.

Every number is written into the section's ``results`` dict as soon as it is known.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from optpipe_lightning.schedule import Action, Problem
    from optpipe_lightning.strategy.runtime.op_memory import OpMemoryWatch


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    heads: int
    seq: int
    batch: int

    def describe(self) -> str:
        return f"h={self.hidden} a={self.heads} s={self.seq} b={self.batch}"


class Block(nn.Module):
    """One GPT layer: pre-LayerNorm, causal self-attention, 4h GELU MLP, residuals."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # [b, heads, s, d] each, views of one storage
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def make_layers(
    shape: LayerShape, n: int, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> list[nn.Module]:
    """The harness's layers: ``Scale`` (layer group 0) then ``n`` GPT layers (layer group 1)."""
    torch.manual_seed(seed)
    blocks = [Block(shape.hidden, shape.heads).to(device=device, dtype=dtype) for _ in range(n)]
    return [Scale().to(device=device, dtype=dtype), *blocks]


class Scale(nn.Module):
    """Layer group 0 of the harness: a learnable scalar, so that group 1 (the stage under test)
    is not torch's first stage and runs a real split backward (torch gives stage 0 an empty I
    and the whole backward at W)."""

    def __init__(self) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.s


TINY = 1e-6  # seconds the harness gives group 0's ops in the simulator


def harness_problem(m: int, c: dict[str, float], out_bytes: float, **kw: Any) -> Problem:
    """One device, two chunks: chunk 0 is ``Scale`` (its output, ``out_bytes``, lives until its
    backward), chunk 1 the stage under test with costs ``c``."""
    from optpipe_lightning.schedule import Problem

    off = kw.pop("offload_bytes", None)
    bw = kw.pop("bandwidth", None)
    if off is not None and bw is not None:
        kw["offload"] = {"bytes": [[0.0, off]], "d2h_bandwidth": bw[0], "h2d_bandwidth": bw[1]}
    return Problem(
        num_stages=1,
        num_microbatches=m,
        num_chunks=2,
        placement="interleaved",
        t_f=[[TINY, c["t_f"]]],
        t_b=[[TINY, c["t_b"]]],
        t_w=[[TINY, c["t_w"]]],
        t_bw=[[TINY, c["t_bw"]]],
        m_f=[[out_bytes, c["m_f"]]],
        # torch's input-gradient pass keeps the graph: by default W frees everything
        m_b=[[0.0, c.get("m_b", 0.0)]],
        m_w=[[-out_bytes, -c["m_f"] - c.get("m_b", 0.0)]],
        **kw,
    )


def harness_row(row: list[Action]) -> list[Action]:
    """A one-chunk stage's action list as the harness runs it: its ops on chunk 1, group 0's
    forward right before each forward, group 0's whole backward right after each B or BW."""
    from optpipe_lightning.schedule import Action

    out: list[Action] = []
    for a in row:
        if a.op == "F":
            out += [Action("F", a.mb, 0), Action("F", a.mb, 1)]
        elif a.op in ("B", "BW"):
            out += [Action(a.op, a.mb, 1), Action("BW", a.mb, 0)]
        else:
            out.append(Action(a.op, a.mb, 1))
    return out


def process_group() -> Any:
    """A one-process group (gloo): the executor's stage needs one; nothing is sent."""
    if not dist.is_initialized():
        d = tempfile.mkdtemp(prefix="gpu_check_pg_")
        dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
    return dist.group.WORLD


def incoming_grad_loss(out: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The 'loss' whose gradient with respect to ``out`` is ``g``: the made-up gradient the next
    stage would have sent. (In the activation dtype: an fp32 copy of ``out`` saved for the
    backward would hold memory a pipeline stage does not.)"""
    return (out * g).sum()


def device_kind(device: torch.device) -> tuple[str, str]:
    """(``optpipe problem`` device kind, note) for this device."""
    if device.type != "cuda":
        return "cpu", ""
    name = torch.cuda.get_device_name(device)
    for kind in ("h200", "h100", "a100"):
        if kind in name.lower():
            return kind, ""
    return "h100", f"{name} is not in the estimate's device table; compared with h100"


def estimate(
    shape: LayerShape, layers: int, dtype: torch.dtype, kind: str, m: int
) -> dict[str, Any]:
    """What ``optpipe problem`` says for ``layers`` such layers on one stage."""
    from optpipe_lightning.schedule.model_estimate import DEVICES, ModelSpec, estimate_problem

    kw: dict[str, Any] = {
        "layers": layers,
        "hidden": shape.hidden,
        "heads": shape.heads,
        "seq_len": shape.seq,
        "microbatch_size": shape.batch,
        "dtype": "bf16" if dtype == torch.bfloat16 else "fp32",
        "device": kind,
        "num_stages": 1,
        "num_microbatches": m,
    }
    attention = "flash" if "attention" in ModelSpec.model_fields else None
    if attention is not None:
        kw["attention"] = attention
    spec = ModelSpec(**kw)
    pb = estimate_problem(spec)
    dev = DEVICES[kind]
    speed = dev.peak(spec.dtype) * (spec.efficiency or dev.efficiency)
    t_f = float(pb.cost("t_f")[0, 0])
    return {
        "t_f": t_f,
        "t_b": float(pb.cost("t_b")[0, 0]),
        "t_w": float(pb.cost("t_w")[0, 0]),
        "t_bw": float(pb.cost("t_bw")[0, 0]),
        "t_comm": float(pb.cost("t_comm")[0, 0]),
        "m_f": float(pb.cost("m_f")[0, 0]),
        "flops_f": t_f * speed,
        "efficiency": float(spec.efficiency or dev.efficiency),
        "attention": attention or "eager (the estimate keeps the 5as^2 score term)",
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _saved_bytes(
    chain: nn.Module, x: torch.Tensor, exclude: set[int]
) -> tuple[torch.Tensor, dict[int, int]]:
    """Run the forward; the distinct storages autograd saved (bytes by storage pointer), not
    counting ``exclude`` (parameters and the input)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        ptr = int(st.data_ptr())
        if ptr and ptr not in exclude and ptr not in seen:
            seen[ptr] = int(st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = chain(x)
    return out, seen


def measure_microbatch_memory(
    layers: list[nn.Module], shape: LayerShape, dtype: torch.dtype, device: torch.device
) -> dict[str, float]:
    """Bytes one microbatch's forward saves and allocates, and the transient peak above them."""
    chain = nn.Sequential(*layers)
    params = list(chain.parameters())
    for p in params:  # gradients exist already (they are static memory in training)
        p.grad = torch.zeros_like(p)
    x = torch.randn(
        shape.batch, shape.seq, shape.hidden, dtype=dtype, device=device, requires_grad=True
    )
    g = torch.randn_like(x)
    exclude = {int(p.untyped_storage().data_ptr()) for p in params}
    exclude.add(int(x.untyped_storage().data_ptr()))
    cuda = device.type == "cuda"
    _sync(device)
    before = torch.cuda.memory_allocated(device) if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    out, seen = _saved_bytes(chain, x, exclude)
    _sync(device)
    res: dict[str, float] = {}
    out_ptr = int(out.untyped_storage().data_ptr())
    out_bytes = int(out.untyped_storage().nbytes())
    saved = float(sum(seen.values()))
    res["saved_bytes"] = saved  # what saved-tensor hooks see (not the input, not parameters)
    res["output_bytes"] = float(out_bytes)
    # what F adds to memory: saved storages plus the output the stage keeps for the backward
    res["activation_bytes"] = saved + (0 if out_ptr in seen else out_bytes)
    # what an offload can free: not the output (the stage holds it)
    res["offloadable_bytes"] = saved - seen.get(out_ptr, 0)
    if cuda:
        alloc = torch.cuda.memory_allocated(device) - before
        peak_f = torch.cuda.max_memory_allocated(device) - before
        torch.cuda.reset_peak_memory_stats(device)
        out.backward(g)
        _sync(device)
        peak_b = torch.cuda.max_memory_allocated(device) - before
        res["allocated_bytes"] = float(alloc)  # the allocator's view of the same (rounded)
        res["transient_bytes"] = float(max(peak_f, peak_b) - alloc)  # workspace above it
    else:
        out.backward(g)
    del out, x, g
    for p in params:
        p.grad = None
    return res


def memory_watch(device: torch.device) -> OpMemoryWatch | None:
    """The allocator watch for the op-cost engine's cursor when the engine has none of its own
    (it has one on CUDA: the profiler's). None: no per-op memory (CPU). Tests replace this to
    drive the accounting on CPU with made-up allocator readings."""
    return None


def op_memory(watch: OpMemoryWatch) -> dict[str, Any]:
    """What the cursor's allocator watch saw in the timed steps, for the report and the stage
    section: per op of the stage under test (chunk 1) the median bytes it left allocated
    (``alloc_F`` ...: from its start to the next action's start, so the loss and torch's
    hand-over of the input gradient count too) and its largest transient (``peak_F`` ...: the
    rise above both ends); and ``memory``, the profile's ``OpMemory`` of each chunk as the
    strategy's profiler builds it (chunk 0 only runs F and fused BW: its BW frees what its F
    left)."""
    from optpipe_lightning.schedule.profile import OpMemory
    from optpipe_lightning.strategy.runtime.op_memory import summarize

    out: dict[str, Any] = {}
    stage = watch.chunk_samples(1)
    for op, v in stage.items():
        out[f"alloc_{op}"] = float(statistics.median(d for d, _ in v))
        out[f"peak_{op}"] = float(max(t for _, t in v))
    mem: dict[int, dict[str, Any]] = {}
    one = summarize(stage)
    if one is not None:
        mem[1] = one.model_dump()
    group0 = watch.chunk_samples(0)
    if group0.get("F") and group0.get("BW"):
        f = float(statistics.median(d for d, _ in group0["F"]))
        mem[0] = OpMemory(
            f=f,
            b=0.0,
            w=-f,
            bw=float(statistics.median(d for d, _ in group0["BW"])),
            transient=float(max(t for v in group0.values() for _, t in v)),
            samples=len(group0["F"]),
        ).model_dump()
    if mem:
        out["memory"] = mem
    return out


def op_costs(
    res: dict[str, Any],
    flush: Callable[[], None],
    shapes: list[LayerShape],
    layers_per_stage: int,
    microbatches: int,
    steps: int,
    dtype: torch.dtype,
    device: torch.device,
) -> dict[LayerShape, dict[str, Any]]:
    """Section 3. Returns the measured costs per shape (for the stage section)."""
    from optpipe_lightning.schedule import Action
    from optpipe_lightning.schedule.baselines import make_schedule
    from optpipe_lightning.strategy.runtime.engine import PipelineEngine

    kind, note = device_kind(device)
    res["device_kind"] = kind
    if note:
        res["note"] = note
    res["layers_per_stage"] = layers_per_stage
    res["timer"] = "CUDA events" if device.type == "cuda" else "perf_counter (CPU)"
    pg = process_group()
    measured: dict[LayerShape, dict[str, Any]] = {}
    rows = res.setdefault("sizes", [])
    for shape in shapes:
        row: dict[str, Any] = {"layer": shape.describe()}
        rows.append(row)
        layers = make_layers(shape, layers_per_stage, dtype, device)
        m = microbatches
        order: list[Action] = []
        for i in range(m):  # like the profiling schedule: split and fused backward alternate
            order.append(Action("F", i))
            order += [Action("B", i), Action("W", i)] if i % 2 == 0 else [Action("BW", i)]
        unit = {"t_f": 1.0, "t_b": 1.0, "t_w": 1.0, "t_bw": 2.0, "m_f": 1.0}
        pb = harness_problem(m, unit, 1.0)
        sched = make_schedule(pb, "op-costs", [harness_row(order)])
        engine = PipelineEngine(
            layers,
            incoming_grad_loss,
            pb,
            sched,
            [1, layers_per_stage],
            0,
            pg,
            device,
            measure=True,
        )
        x = torch.randn(m * shape.batch, shape.seq, shape.hidden, dtype=dtype, device=device)
        g = torch.randn_like(x)
        watch = memory_watch(device)
        if watch is not None and engine.cursor.memory is None:
            engine.cursor.memory, engine.cursor.watch_memory = watch, True
        engine.step(x, g)  # warm-up: shape inference, kernel selection, allocator
        engine.cursor.drop_times()  # and its allocator samples
        for _ in range(steps):
            engine.step(x, g)
        t = {
            op: statistics.median(engine.cursor.times[(op, 1)])
            for op in ("F", "B", "W", "BW")
            if engine.cursor.times.get((op, 1))
        }
        meas = {"t_f": t["F"], "t_b": t["B"], "t_w": t["W"], "t_bw": t["BW"]}
        if engine.cursor.memory is not None:  # CUDA: the profiler's per-op allocator watch
            meas.update(op_memory(engine.cursor.memory))
        meas.update(measure_microbatch_memory(layers[1:], shape, dtype, device))
        est = estimate(shape, layers_per_stage, dtype, kind, m)
        row["measured"] = meas
        row["estimate"] = est
        ratio = {k: meas[k] / est[k] for k in ("t_f", "t_b", "t_w", "t_bw") if est[k] > 0}
        ratio["m_f"] = meas["activation_bytes"] / est["m_f"]
        if "allocated_bytes" in meas:
            ratio["m_f_allocated"] = meas["allocated_bytes"] / est["m_f"]
        row["measured_over_estimate"] = ratio
        # the efficiency (fraction of peak) the measured forward implies
        row["implied_efficiency"] = est["efficiency"] * est["t_f"] / meas["t_f"]
        row["tflops_f"] = est["flops_f"] / meas["t_f"] / 1e12
        measured[shape] = {**meas, "t_comm": est["t_comm"]}
        flush()
        del engine, x, g, layers
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return measured
