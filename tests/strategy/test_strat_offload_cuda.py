"""The CUDA offload path: two copy streams that overlap, a backward that waits for its reload,
copy sources that stay allocated until their copy ends, and memory that is really freed.

Marked ``gpu`` (skipped without CUDA); ``benchmarks/gpu_check`` runs them on the GPU machine.
A delayed copy stream (``torch.cuda._sleep``) turns a missing wait into wrong numbers: the buffers
involved are filled with NaN first, so reading one early shows.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from optpipe_lightning.schedule import Action
from optpipe_lightning.schedule.baselines import make_schedule
from optpipe_lightning.strategy.runtime.copy_engines import CudaCopyEngine
from optpipe_lightning.strategy.runtime.offload import OffloadManager

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MB = 1 << 20
SLEEP_CYCLES = 200_000_000  # ~0.1 s on a 2 GHz GPU clock: longer than any copy here


def _dev() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _forward(mgr: OffloadManager, key: tuple[int, int, int], x: torch.Tensor, w: torch.Tensor):
    with mgr.store(key).hooks():
        return torch.tanh(torch.tanh(x @ w) @ w).sum()


def _reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xr = x.detach().clone().requires_grad_(True)
    torch.tanh(torch.tanh(xr @ w.detach()) @ w.detach()).sum().backward()
    assert xr.grad is not None
    return xr.grad


def _poison(nbytes: int, dev: torch.device) -> None:
    """Fill the allocator's free blocks of this size with NaN (the next allocation reuses one)."""
    t = torch.full((nbytes // 4,), float("nan"), device=dev)
    del t


def test_an_offload_and_a_reload_run_at_the_same_time_on_two_streams() -> None:
    dev = _dev()
    eng = CudaCopyEngine(dev)
    assert eng.d2h != eng.h2d
    n = 256 * MB
    x = torch.randint(0, 255, (n,), dtype=torch.uint8, device=dev)
    y = torch.randint(0, 255, (n,), dtype=torch.uint8, device=dev)
    host_y, ev = eng.offload([y])
    ev.synchronize()
    torch.cuda.synchronize(dev)
    t0 = torch.cuda.Event(enable_timing=True)
    t0.record(torch.cuda.current_stream(dev))
    marks = {}
    for name, st in (("d2h", eng.d2h), ("h2d", eng.h2d)):
        e = torch.cuda.Event(enable_timing=True)
        e.record(st)
        marks[name] = [e]
    _host_x, _ = eng.offload([x])
    (back,), _ = eng.reload(host_y, dev, None)
    for name, st in (("d2h", eng.d2h), ("h2d", eng.h2d)):
        e = torch.cuda.Event(enable_timing=True)
        e.record(st)
        marks[name].append(e)
    torch.cuda.synchronize(dev)
    (d0, d1), (h0, h1) = ((t0.elapsed_time(a), t0.elapsed_time(b)) for a, b in marks.values())
    both = min(d1, h1) - max(d0, h0)
    assert both > 0.5 * min(d1 - d0, h1 - h0), (d0, d1, h0, h1)  # they ran together
    assert torch.equal(back, y)
    eng.close()


def test_the_backward_waits_for_its_reload() -> None:
    dev = _dev()
    w = nn.Parameter(torch.randn(1024, 1024, device=dev) / 32)
    mgr = OffloadManager(dev, [w], min_bytes=0)
    key = (0, 0, 0)
    x = torch.randn(4096, 1024, device=dev, requires_grad=True)
    y = _forward(mgr, key, x, w)
    mgr.offload(key)
    mgr.synchronize()
    _poison(4096 * 1024 * 4, dev)  # the reload buffers will start as NaN
    with torch.cuda.stream(mgr.engine.h2d):
        torch.cuda._sleep(SLEEP_CYCLES)  # the reload's copy lands late
    mgr.reload(key)
    y.backward()  # no host sync: only the stream wait orders it after the copy
    assert x.grad is not None
    torch.testing.assert_close(x.grad, _reference(x, w))
    mgr.close()


def test_an_offload_source_is_not_reused_before_its_copy_ends() -> None:
    dev = _dev()
    w = nn.Parameter(torch.randn(1024, 1024, device=dev) / 32)
    mgr = OffloadManager(dev, [w], min_bytes=0)
    key = (0, 0, 0)
    x = torch.randn(4096, 1024, device=dev, requires_grad=True)
    y = _forward(mgr, key, x, w)
    with torch.cuda.stream(mgr.engine.d2h):
        torch.cuda._sleep(SLEEP_CYCLES)  # the offload's copy starts late
    mgr.offload(key)
    assert mgr.pending  # the device copies are kept while the copy has not run
    # new work on the compute stream must not get (and overwrite) the blocks being copied
    junk = [torch.full((4096, 1024), float("nan"), device=dev) for _ in range(4)]
    mgr.poll()
    mgr.reload(key)
    y.backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, _reference(x, w))
    del junk
    mgr.close()


def test_memory_is_freed_by_the_offload_and_taken_again_by_the_reload() -> None:
    dev = _dev()
    w = nn.Parameter(torch.randn(2048, 2048, device=dev) / 45)
    mgr = OffloadManager(dev, [w], min_bytes=0)
    key = (0, 0, 0)
    x = torch.randn(8192, 2048, device=dev, requires_grad=True)
    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_allocated(dev)
    y = _forward(mgr, key, x, w)
    held = torch.cuda.memory_allocated(dev) - base
    mgr.keep_held(key, [x])  # the stage's input: held by the stage, never moved
    mgr.offload(key)
    moved = mgr.stores[key].moved_bytes
    assert moved > 0.9 * held  # the two tanh outputs: everything the forward added
    mgr.synchronize()  # the copy is done: the device copies go
    after = torch.cuda.memory_allocated(dev) - base
    assert held - after >= 0.99 * moved
    mgr.reload(key)
    assert torch.cuda.memory_allocated(dev) - base >= held - 0.01 * moved
    y.backward()
    mgr.release(key)
    del y
    torch.cuda.synchronize(dev)
    grads = (x.numel() + w.numel()) * 4  # x.grad and w.grad appeared in the backward
    assert torch.cuda.memory_allocated(dev) - base <= 0.01 * moved + grads
    mgr.close()


def test_a_pipeline_step_with_offload_on_cuda_matches_one_without() -> None:
    from gpu_check.stage import (
        LayerShape,
        harness_problem,
        harness_row,
        incoming_grad_loss,
        make_layers,
        process_group,
    )

    from optpipe_lightning.strategy.runtime.engine import PipelineEngine

    dev = _dev()
    shape, n, m = LayerShape(512, 8, 256, 2), 2, 4
    a = Action
    row = [a("F", 0), a("OFFLOAD", 0), a("F", 1), a("OFFLOAD", 1), a("F", 2), a("B", 2)]
    row += [a("W", 2), a("F", 3), a("B", 3), a("W", 3), a("RELOAD", 1), a("B", 1), a("W", 1)]
    row += [a("RELOAD", 0), a("B", 0), a("W", 0)]
    costs = {"t_f": 1.0, "t_b": 1.0, "t_w": 1.0, "t_bw": 2.0, "m_f": 1.0}
    pb = harness_problem(m, costs, 0.1, offload_bytes=0.9, bandwidth=(1.0, 1.0))
    plain = harness_problem(m, costs, 0.1)
    import torch.distributed as dist

    pg = process_group()
    grads = []
    for problem, actions in ((pb, row), (plain, [x for x in row if x.is_compute])):
        layers = make_layers(shape, n, torch.float32, dev, seed=3)
        engine = PipelineEngine(
            layers,
            incoming_grad_loss,
            problem,
            make_schedule(problem, "t", [harness_row(actions)]),
            [1, n],
            0,
            pg,
            dev,
        )
        x = torch.randn(m * shape.batch, shape.seq, shape.hidden, device=dev)
        g = torch.randn_like(x)
        engine.step(x, g)
        grads.append([p.grad.clone() for p in engine.parameters if p.grad is not None])
        if problem is pb:
            assert [h[0] for h in engine.offload.history].count("OFFLOAD") == 2
    dist.destroy_process_group()
    for got, want in zip(*grads, strict=True):  # attention's backward may use atomics
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_a_reload_that_waits_for_memory_takes_the_room_of_the_offload_it_waits_for() -> None:
    """The simulator's reload wait on a GPU: reload 0 waits for offload 1 (delayed on its
    stream). The device then holds no more than before the reload (offload 1's copies went, the
    reload took their room), and neither copy is corrupted: the reload's buffers may reuse
    offload 1's blocks only because its H2D stream waits on that copy."""
    dev = _dev()
    w = nn.Parameter(torch.randn(1024, 1024, device=dev) / 32)
    mgr = OffloadManager(dev, [w], min_bytes=0)
    xs = [torch.randn(4096, 1024, device=dev, requires_grad=True) for _ in range(2)]
    y0 = _forward(mgr, (0, 0, 0), xs[0], w)
    mgr.keep_held((0, 0, 0), [xs[0]])
    mgr.offload((0, 0, 0))
    mgr.synchronize()
    y1 = _forward(mgr, (0, 1, 0), xs[1], w)
    mgr.keep_held((0, 1, 0), [xs[1]])
    with torch.cuda.stream(mgr.engine.d2h):
        torch.cuda._sleep(SLEEP_CYCLES)  # offload 1's copy lands late
    mgr.offload((0, 1, 0))
    assert mgr.holds_offload((0, 1, 0))
    before = torch.cuda.memory_allocated(dev)
    mgr.reload((0, 0, 0), after=[(0, 1, 0)])
    assert torch.cuda.memory_allocated(dev) <= before  # same bytes: offload 1's room
    y0.backward()
    mgr.release((0, 0, 0))
    mgr.reload((0, 1, 0))
    y1.backward()
    for x in xs:
        assert x.grad is not None
        torch.testing.assert_close(x.grad, _reference(x, w))
    mgr.close()
