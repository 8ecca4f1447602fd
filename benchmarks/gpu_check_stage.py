"""The transformer-layer sections of ``benchmarks/gpu_check.py``.

- ``op_costs``: F, B, W and fused BW of a GPT layer group (pre-LayerNorm, causal attention
  through ``scaled_dot_product_attention``, 4h GELU MLP, no dropout), timed by the executor's own
  cursor (CUDA events on GPU) while torch's runtime runs them with its split backward, against
  what ``optpipe problem`` estimates for the same layers (``schedule.model_estimate``); and the
  bytes one microbatch's forward saves (saved-tensor hooks) and allocates (the CUDA allocator),
  against the estimate's activation bytes.
- ``stage_schedule``: a pipeline problem from those measured costs and the measured copy
  bandwidths, solved under a memory limit that forces offload; the stage with the most offloads
  runs its action list alone with the executor's ``OptPipeStage`` and the real
  ``OffloadManager`` (its input batch and the incoming gradients made up, as if the neighbours had
  sent them: the loss ``(out * g).sum()`` hands ``g`` to the backward). Measured peak of
  ``torch.cuda.max_memory_allocated`` above the static memory (weights, gradients, optimizer
  state, inputs) against the simulator's peak for that list, and the measured step time against
  the simulated one; then the same list with the limit just under its need must be refused by
  the executor before anything runs.

Every number is written into the section's ``results`` dict as soon as it is known.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from optpipe_lightning.schedule import Action, Problem, Schedule
    from optpipe_lightning.strategy.engine import PipelineEngine


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


def op_memory(
    engine: PipelineEngine, x: torch.Tensor, g: torch.Tensor, device: torch.device
) -> dict[str, float]:
    """One more step, watching the allocator around every op of the stage under test (chunk 1):
    what each op leaves allocated (``alloc_F`` ...: the memory model's m_f, m_b, m_w in the
    allocator's view; B's includes the input gradient it hands back) and how far above its
    start and end it peaks (``peak_F`` ...). Allocator statistics follow the host's issue order,
    so no synchronization is needed."""
    cur = engine.cursor
    begin, end = cur.begin, cur.end
    rec: dict[str, list[tuple[int, int]]] = {}
    start = [0]

    def watched_begin(op: str, mb: int, chunk: int) -> None:
        begin(op, mb, chunk)
        if chunk == 1:
            torch.cuda.reset_peak_memory_stats(device)
            start[0] = torch.cuda.memory_allocated(device)

    def watched_end(op: str, mb: int, chunk: int) -> None:
        if chunk == 1:
            now = torch.cuda.memory_allocated(device)
            peak = torch.cuda.max_memory_allocated(device)
            rec.setdefault(op, []).append((now - start[0], peak - max(start[0], now)))
        end(op, mb, chunk)

    cur.begin, cur.end = watched_begin, watched_end  # type: ignore[method-assign]
    try:
        engine.step(x, g)
    finally:
        del cur.begin, cur.end
    out: dict[str, float] = {}
    for op, v in rec.items():
        out[f"alloc_{op}"] = float(statistics.fmean(d for d, _ in v))
        out[f"peak_{op}"] = float(max(p for _, p in v))
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
) -> dict[LayerShape, dict[str, float]]:
    """Section 3. Returns the measured costs per shape (for the stage section)."""
    from optpipe_lightning.schedule import Action
    from optpipe_lightning.schedule.baselines import make_schedule
    from optpipe_lightning.strategy.engine import PipelineEngine

    kind, note = device_kind(device)
    res["device_kind"] = kind
    if note:
        res["note"] = note
    res["layers_per_stage"] = layers_per_stage
    res["timer"] = "CUDA events" if device.type == "cuda" else "perf_counter (CPU)"
    pg = process_group()
    measured: dict[LayerShape, dict[str, float]] = {}
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
        engine.step(x, g)  # warm-up: shape inference, kernel selection, allocator
        engine.cursor.drop_times()
        for _ in range(steps):
            engine.step(x, g)
        t = {
            op: statistics.median(engine.cursor.times[(op, 1)])
            for op in ("F", "B", "W", "BW")
            if engine.cursor.times.get((op, 1))
        }
        meas = {"t_f": t["F"], "t_b": t["B"], "t_w": t["W"], "t_bw": t["BW"]}
        if device.type == "cuda":
            meas.update(op_memory(engine, x, g, device))
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


# -- one stage's schedule ------------------------------------------------------------------------


def _schedule_with_offloads(problem: Problem, seconds: float) -> tuple[Schedule, str, Problem]:
    """The solver's schedule when it offloads; else the fastest feasible baseline that does
    (this section is about running offloads; the note says when the solver chose none)."""
    from optpipe_lightning.schedule import simulate
    from optpipe_lightning.schedule.baselines import NotApplicable, generate

    notes: list[str] = []
    cands: list[tuple[float, Schedule, str]] = []
    try:
        from optpipe_lightning.solver import InfeasibleMemoryLimit, solve
    except ImportError as e:  # pragma: no cover - a machine without the solver's dependencies
        notes.append(f"solver unavailable ({e})")
    else:
        try:
            r = solve(problem, time_limit=seconds, workers=2, seed=0)
        except InfeasibleMemoryLimit as e:
            problem = problem.with_changes(memory_limit=e.smallest_feasible_limit * 1.02)
            notes.append(f"limit raised to the smallest feasible ({e.smallest_feasible_limit:.4g})")
            r = solve(problem, time_limit=seconds, workers=2, seed=0)
        how = f"solver ({r.backend}, {r.status}, {r.solve_seconds:.1f} s)"
        if r.schedule.num_offloaded() > 0:
            return r.schedule, "; ".join([how, *notes]), problem
        notes.append(f"{how} offloads nothing (makespan {r.makespan:.4g} s)")
    for name in ("adaoffload", "pipeoffload"):
        try:
            s = generate(name, problem)
        except NotApplicable:
            continue
        except Exception as e:  # a baseline that fails here is noted, the others still count
            notes.append(f"{name}: {type(e).__name__}: {e}")
            continue
        ev = simulate(problem, s).evaluation
        if ev.feasible and ev.makespan is not None and s.num_offloaded() > 0:
            cands.append((ev.makespan, s, f"baseline {name}"))
    if not cands:
        raise RuntimeError("no schedule with offloads fits the limit: " + "; ".join(notes))
    _, best, how = min(cands, key=lambda c: c[0])
    return best, "; ".join([how, *notes]), problem


def stage_schedule(
    res: dict[str, Any],
    flush: Callable[[], None],
    shape: LayerShape,
    layers_per_stage: int,
    stages: int,
    microbatches: int,
    limit_fraction: float,
    steps: int,
    solver_seconds: float,
    costs: dict[str, float] | None,
    bandwidth: tuple[float, float] | None,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Section 4 (the module docstring says what it does)."""
    from optpipe_lightning.schedule import Problem, simulate
    from optpipe_lightning.schedule.baselines import make_schedule
    from optpipe_lightning.schedule.model_estimate import DEVICES
    from optpipe_lightning.strategy.engine import PipelineEngine, ScheduleRejectedError

    cuda = device.type == "cuda"
    kind, _ = device_kind(device)
    p, m, n = stages, microbatches, layers_per_stage
    if costs is None:  # the op-cost section did not run: the estimate stands in
        est = estimate(shape, n, dtype, kind, m)
        costs = {
            "t_f": est["t_f"],
            "t_b": est["t_b"],
            "t_w": est["t_w"],
            "t_bw": est["t_bw"],
            "t_comm": est["t_comm"],
            "activation_bytes": est["m_f"],
            "offloadable_bytes": est["m_f"],
        }
        res["costs_from"] = "estimate (op-cost section missing)"
    else:
        res["costs_from"] = "measured (op-cost section)"
    if bandwidth is None:
        bw = DEVICES[kind].copy_bandwidth
        bandwidth = (bw, bw)
        res["bandwidth_from"] = "estimate (copy section missing)"
    else:
        res["bandwidth_from"] = "measured (copy section)"
    act = costs.get("allocated_bytes", costs["activation_bytes"])
    off = min(costs["offloadable_bytes"], act)
    problem = Problem(
        num_stages=p,
        num_microbatches=m,
        t_f=costs["t_f"],
        t_b=costs["t_b"],
        t_w=costs["t_w"],
        t_bw=costs["t_bw"],
        t_comm=costs["t_comm"],
        m_f=act,
        m_b=0.0,  # torch's input-gradient pass keeps the graph: W frees everything
        m_w=-act,
        memory_limit=limit_fraction * p * act,
        offload={"bytes": off, "d2h_bandwidth": bandwidth[0], "h2d_bandwidth": bandwidth[1]},
        name=f"gpu_check {shape.describe()} x{n}",
    )
    res["problem"] = {
        "layer": shape.describe(),
        "layers_per_stage": n,
        "stages": p,
        "microbatches": m,
        "activation_bytes": act,
        "offload_bytes": off,
        "d2h_bandwidth": bandwidth[0],
        "h2d_bandwidth": bandwidth[1],
    }
    sched, how, problem = _schedule_with_offloads(problem, solver_seconds)
    full = simulate(problem, sched)
    assert full.evaluation.makespan is not None
    offloads = [sum(a.op == "OFFLOAD" for a in row) for row in sched.actions]
    s = max(range(p), key=lambda i: (offloads[i], -i))
    limits = problem.memory_limits()
    res["schedule"] = {
        "from": how,
        "makespan": full.evaluation.makespan,
        "offloads_per_stage": offloads,
        "memory_limit": limits[0],
        "stage": s,
    }
    flush()
    # the stage's list run alone (neighbours answer at once), as the harness runs it: group 0
    # (``Scale``) hands the made-up input on, group 1 is the stage
    row = harness_row(list(sched.actions[s]))
    c1 = {k: costs[k] for k in ("t_f", "t_b", "t_w", "t_bw")} | {"m_f": act}
    in_bytes = float(shape.batch * shape.seq * shape.hidden * torch.finfo(dtype).bits // 8)
    # the limit covers the stage and group 0's outputs (the inputs a real stage receives), one
    # per microbatch in flight
    in_flight, most = 0, 0
    for a in sched.actions[s]:
        in_flight += {"F": 1, "B": -1, "BW": -1}.get(a.op, 0)
        most = max(most, in_flight)
    assert limits[s] is not None
    limit = float(limits[s] or 0.0) + most * in_bytes

    def harness(lim: float | None, transfers: bool = True) -> Problem:
        kw: dict[str, Any] = {"memory_limit": lim}
        if transfers:
            kw.update(offload_bytes=off, bandwidth=bandwidth)
        return harness_problem(m, c1, in_bytes, **kw)

    alone = harness(limit)
    sim = simulate(alone, [row])
    if not sim.feasible:
        raise RuntimeError(
            "the stage's list does not fit its limit when it runs alone: "
            + "; ".join(v.message for v in sim.evaluation.violations[:2])
        )
    assert sim.evaluation.makespan is not None and sim.evaluation.peak_memory is not None
    predicted_peak = float(sim.evaluation.peak_memory[0])
    res["predicted"] = {
        "stage_time_s": sim.evaluation.makespan,
        "activation_peak_bytes": predicted_peak,
        "model": "B frees nothing, W frees the activation (what the strategy's profile says)",
        "memory_limit_bytes": limit,
        "memory_waits": len(sim.timeline.memory_waits[0]) if sim.timeline else 0,
        "stage_peak_in_pipeline_bytes": float((full.evaluation.peak_memory or [0.0] * p)[s]),
    }
    if "alloc_F" in costs and "alloc_B" in costs:
        # the same list on the per-op memory the op-cost section watched (B keeps the output
        # gradients W needs, and the input gradient until it is handed on)
        c_meas = c1 | {"m_f": costs["alloc_F"], "m_b": costs["alloc_B"]}
        alt = harness_problem(
            m, c_meas, in_bytes, memory_limit=limit, offload_bytes=off, bandwidth=bandwidth
        )
        alt_ev = simulate(alt, [row]).evaluation
        res["predicted"]["activation_peak_measured_deltas_bytes"] = float(
            (alt_ev.peak_memory or [0.0])[0]
        )
        res["predicted"]["largest_op_transient_bytes"] = max(
            float(costs.get(f"peak_{op}", 0.0)) for op in ("F", "B", "W", "BW")
        )
    flush()
    pg = process_group()
    layers = make_layers(shape, n, dtype, device, seed=1)
    engine = PipelineEngine(
        layers,
        incoming_grad_loss,
        alone,
        make_schedule(alone, f"stage {s} of {sched.generator}", [row]),
        [1, n],
        0,
        pg,
        device,
        offload_min_bytes=1024,
    )
    opt = torch.optim.AdamW(engine.parameters, lr=1e-4)
    x = torch.randn(m * shape.batch, shape.seq, shape.hidden, dtype=dtype, device=device)
    g = torch.randn_like(x)
    engine.step(x, g)  # warm-up: shape inference, kernels, pinned pages
    opt.step()  # optimizer state exists from here on
    opt.zero_grad(set_to_none=False)  # gradients stay allocated: static memory
    _sync(device)
    measured: dict[str, Any] = {}
    res["measured"] = measured
    frac_set = False
    static = 0
    try:
        if cuda:
            static = torch.cuda.memory_allocated(device)
            total = torch.cuda.get_device_properties(device).total_memory
            # a cap well above the prediction: it stops a runaway executor, while a model that
            # is somewhat off still gets measured (the ratios below say by how much)
            cap = static + limit * 2.0 + costs.get("transient_bytes", 0.0)
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
            frac_set = True
            measured["static_bytes"] = static
            measured["device_cap_bytes"] = cap
            torch.cuda.reset_peak_memory_stats(device)
            reserved0 = torch.cuda.memory_reserved(device)
        times, peaks = [], []
        for _ in range(steps):
            _sync(device)
            t0 = time.perf_counter()
            try:
                engine.step(x, g)
            except RuntimeError as e:  # the executor broke the model's memory
                # torch's stage backward re-raises an out-of-memory as a plain RuntimeError
                oom = _out_of_memory(e)
                if oom is None:
                    raise
                measured["oom"] = str(oom).strip().splitlines()[0][:300]
                measured["peak_at_oom_bytes"] = torch.cuda.max_memory_allocated(device) - static
                break
            _sync(device)
            times.append(time.perf_counter() - t0)
            if cuda:
                peaks.append(torch.cuda.max_memory_allocated(device) - static)
            opt.zero_grad(set_to_none=False)
        if not times:
            raise RuntimeError(f"out of memory under the cap: {measured['oom']}")
        hist = engine.offload.history
        measured["stage_time_s"] = statistics.median(times)
        measured["stage_times_s"] = times
        measured["offloads_per_step"] = sum(h[0] == "OFFLOAD" for h in hist)
        measured["waits_per_step"] = sum(h[0] == "WAIT" for h in hist)
        measured["bytes_offloaded_per_step"] = engine.offload.offloaded_total
        measured["schedule_offloads"] = offloads[s]
        measured["time_over_predicted"] = measured["stage_time_s"] / sim.evaluation.makespan
        if cuda:
            measured["activation_peak_bytes"] = max(peaks)
            measured["peak_over_predicted"] = max(peaks) / predicted_peak
            measured["peak_over_predicted_plus_transient"] = max(peaks) / (
                predicted_peak + costs.get("transient_bytes", 0.0)
            )
            alt_peak = res["predicted"].get("activation_peak_measured_deltas_bytes")
            if alt_peak:
                measured["peak_over_predicted_measured_deltas"] = max(peaks) / alt_peak
            measured["reserved_growth_bytes"] = torch.cuda.max_memory_reserved(device) - reserved0
            pool = getattr(engine.offload.engine, "pool", None)
            if pool is not None:
                measured["pinned_host_bytes"] = pool.held_bytes
        else:
            measured["activation_peak_bytes"] = None
            measured["memory_note"] = "CPU: no allocator statistics; memory is checked on GPU"
        flush()
    finally:
        if frac_set:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
    # offload changes no numbers: the same list without its transfers, from the same weights
    plain = harness(None, transfers=False)
    grads_off = _one_step_grads(engine, x, g)
    ref_layers = make_layers(shape, n, dtype, device, seed=1)
    for mine, theirs in zip(ref_layers, layers, strict=True):
        mine.load_state_dict(theirs.state_dict())
    ref = PipelineEngine(
        ref_layers,
        incoming_grad_loss,
        plain,
        make_schedule(plain, "no transfers", [[a for a in row if a.is_compute]]),
        [1, n],
        0,
        pg,
        device,
    )
    grads_ref = _one_step_grads(ref, x, g)
    scale = max(float(t.abs().max()) for t in grads_ref) or 1.0
    diff = max(float((a - b).abs().max()) for a, b in zip(grads_off, grads_ref, strict=True))
    measured["grad_max_abs_diff_over_max"] = diff / scale
    flush()
    del ref, ref_layers, grads_ref, grads_off
    # the same list with the limit just under its need (the smallest limit the simulator
    # accepts, memory waits included): refused before anything runs
    need = _least_limit(harness, [row], limit)
    tight = harness(need * 0.99)
    before = torch.cuda.memory_allocated(device) if cuda else 0
    refused: dict[str, Any] = {"needed_limit": need, "memory_limit": need * 0.99}
    res["tight_limit"] = refused
    try:
        PipelineEngine(
            layers,
            incoming_grad_loss,
            tight,
            make_schedule(tight, f"stage {s}", [row]),
            [1, n],
            0,
            pg,
            device,
        )
        refused["refused"] = False
    except ScheduleRejectedError as e:
        refused["refused"] = True
        refused["error"] = str(e).splitlines()[0]
        refused["one_line"] = "\n" not in str(e)
    except torch.cuda.OutOfMemoryError as e:  # pragma: no cover - the failure this guards
        refused["refused"] = False
        refused["oom"] = str(e).splitlines()[0]
    if cuda:
        refused["allocated_change_bytes"] = torch.cuda.memory_allocated(device) - before
    flush()
    if "oom" in measured:
        raise RuntimeError(f"a step ran out of memory under the cap: {measured['oom']}")


def _out_of_memory(e: BaseException) -> BaseException | None:
    """The out-of-memory error in ``e``'s chain of causes, if any."""
    c: BaseException | None = e
    for _ in range(6):
        if c is None:
            return None
        if isinstance(c, torch.cuda.OutOfMemoryError) or "out of memory" in str(c).lower():
            return c
        c = c.__cause__ or c.__context__
    return None


def _least_limit(
    harness: Callable[[float], Problem], rows: list[list[Action]], feasible: float
) -> float:
    """The smallest memory limit under which the simulator accepts ``rows`` (bisection)."""
    from optpipe_lightning.schedule import simulate

    lo, hi = 0.0, feasible
    for _ in range(40):
        mid = (lo + hi) / 2
        if simulate(harness(mid), rows).feasible:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-4 * hi:
            break
    return hi


def _one_step_grads(engine: PipelineEngine, x: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    for p in engine.parameters:
        p.grad = None
    engine.step(x, g)
    return [p.grad.detach().float().clone() for p in engine.parameters if p.grad is not None]
