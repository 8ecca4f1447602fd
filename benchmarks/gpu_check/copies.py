"""Sections 1 and 2 of ``benchmarks/gpu_check``: the copy engines, and copies under compute.

Bandwidths are timed with CUDA events on the streams that copy; "both at once" queues the two
directions on two streams and times each stream's span (and the span of both together). The
executor's own ``CudaCopyEngine`` (pinned pages, a D2H and an H2D stream) is timed the same way.
The overlap section queues the engine's copies first (their streams wait only on an idle compute
stream), then the matmuls, and compares the matmuls' time with their time alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

GB = 1e9


def _engines() -> Any:
    """The executor's copy engines, imported when first needed: without the package's
    dependencies the raw measurements still run and the section records the import error."""
    from optpipe_lightning.strategy.runtime import copy_engines

    return copy_engines


# -- 1. copy engines ------------------------------------------------------------------------------


def _cuda_span(stream: torch.cuda.Stream, fn: Callable[[], None]) -> tuple[Any, Any]:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(stream)
    with torch.cuda.stream(stream):
        fn()
    b.record(stream)
    return a, b


def copy_engines(
    res: dict[str, Any], flush: Callable[[], None], n: int, reps: int, device: torch.device
) -> tuple[float, float]:
    """Section 1: ``reps`` copies of ``n`` bytes each way. Returns the (d2h, h2d) bytes/s of the
    executor's engine with both directions busy (what an offload and a reload get together)."""
    res["bytes_per_copy"] = n
    if device.type != "cuda":
        src = torch.randint(0, 255, (n,), dtype=torch.uint8)
        best = min(_timed(lambda: src.clone()) for _ in range(reps))
        clones = _engines().HostCopyEngine()
        off = min(_timed(lambda: clones.offload([src])) for _ in range(reps))
        host_copy, _ = clones.offload([src])
        rel = min(_timed(lambda: clones.reload(host_copy, device, None)) for _ in range(reps))
        res["cpu_memcpy_GBps"] = n / best / GB
        res["engine"] = {"d2h_GBps": n / off / GB, "h2d_GBps": n / rel / GB}
        res["note"] = "CPU: synchronous clones; no pinned memory, copy streams or duplex here"
        return n / off, n / rel
    dev_a = torch.randint(0, 255, (n,), dtype=torch.uint8, device=device)
    dev_b = torch.empty_like(dev_a)
    pin_a = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    pin_b = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    page = torch.empty(n, dtype=torch.uint8)
    s1, s2 = torch.cuda.Stream(device), torch.cuda.Stream(device)

    def h2d() -> None:
        dev_b.copy_(pin_a, non_blocking=True)

    def d2h() -> None:
        pin_b.copy_(dev_a, non_blocking=True)

    def many(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(reps):
                fn()

        return run

    torch.cuda.synchronize(device)
    for fn in (h2d, d2h):  # warm-up
        fn()
    torch.cuda.synchronize(device)
    alone = {}
    for name, fn, st in (("h2d", h2d, s1), ("d2h", d2h, s2)):
        a, b = _cuda_span(st, many(fn))
        torch.cuda.synchronize(device)
        alone[name] = reps * n / (a.elapsed_time(b) / 1e3)
    res["pinned_alone_GBps"] = {k: v / GB for k, v in alone.items()}
    flush()
    torch.cuda.synchronize(device)
    a1, b1 = _cuda_span(s1, many(h2d))
    a2, b2 = _cuda_span(s2, many(d2h))
    torch.cuda.synchronize(device)
    both = {
        "h2d": reps * n / (a1.elapsed_time(b1) / 1e3),
        "d2h": reps * n / (a2.elapsed_time(b2) / 1e3),
    }
    first = a1 if a1.elapsed_time(a2) >= 0 else a2
    last = b1 if b2.elapsed_time(b1) >= 0 else b2
    aggregate = 2 * reps * n / (first.elapsed_time(last) / 1e3)
    res["pinned_both_GBps"] = {k: v / GB for k, v in both.items()}
    res["pinned_both_aggregate_GBps"] = aggregate / GB
    res["duplex_ratio"] = aggregate / max(alone.values())  # ~2: full duplex, ~1: one lane
    res["full_duplex"] = res["duplex_ratio"] > 1.6
    flush()
    pageable = {}
    plain: list[tuple[str, Callable[[], Any]]] = [
        ("h2d", lambda: dev_b.copy_(page)),
        ("d2h", lambda: page.copy_(dev_a)),
    ]
    for name, copy in plain:
        pageable[name] = n / min(_timed(copy, device) for _ in range(2)) / GB
    res["pageable_GBps"] = pageable
    flush()
    # the executor's engine: pinned pages, one stream per direction
    eng = _engines().CudaCopyEngine(device)
    host, ev = eng.offload([dev_a])  # also allocates the pages once
    ev.synchronize()
    spans: dict[str, float] = {}

    def engine_off() -> None:
        h, e = eng.offload([dev_a])
        eng.recycle(h, e)

    bufs: list[Any] = []

    def engine_rel() -> None:
        bufs.append(eng.reload(host, device, None)[0])

    # one untimed round first: a page handed back waits for its copy's event, so a cold pool
    # allocates pinned pages (cudaHostAlloc, synchronous) inside the first timed round
    for _ in range(reps):
        engine_off()
    torch.cuda.synchronize(device)
    for name, fn, st in (("d2h", engine_off, eng.d2h), ("h2d", engine_rel, eng.h2d)):
        torch.cuda.synchronize(device)
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record(st)
        for _ in range(reps):
            fn()
        b.record(st)
        torch.cuda.synchronize(device)
        spans[name] = reps * n / (a.elapsed_time(b) / 1e3)
        bufs.clear()
    torch.cuda.synchronize(device)
    ea, eb = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    fa, fb = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    ea.record(eng.d2h)
    fa.record(eng.h2d)
    for _ in range(reps):
        engine_off()
        engine_rel()
    eb.record(eng.d2h)
    fb.record(eng.h2d)
    torch.cuda.synchronize(device)
    eng_both = {
        "d2h": reps * n / (ea.elapsed_time(eb) / 1e3),
        "h2d": reps * n / (fa.elapsed_time(fb) / 1e3),
    }
    bufs.clear()
    res["engine_alone_GBps"] = {k: v / GB for k, v in spans.items()}
    res["engine_both_GBps"] = {k: v / GB for k, v in eng_both.items()}
    res["engine_page_bytes"] = eng.pool.page_bytes
    eng.close()
    flush()
    return eng_both["d2h"], eng_both["h2d"]


def _timed(fn: Callable[[], Any], device: torch.device | None = None) -> float:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


# -- 2. overlap -----------------------------------------------------------------------------------


def overlap(
    res: dict[str, Any],
    flush: Callable[[], None],
    t: int,
    h: int,
    k: int,
    n: int,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Section 2: ``k`` matmuls ``[t, h] x [h, 4h]`` alone and while the engine copies ``n``-byte
    activations each way, and both ways."""
    a = torch.randn(t, h, dtype=dtype, device=device)
    b = torch.randn(h, 4 * h, dtype=dtype, device=device)
    c = torch.empty(t, 4 * h, dtype=dtype, device=device)
    flops = 2.0 * t * h * 4 * h
    res["matmul"] = f"[{t}, {h}] x [{h}, {4 * h}] {str(dtype).replace('torch.', '')}"

    def mm() -> None:
        for _ in range(k):
            torch.matmul(a, b, out=c)

    mm()  # warm-up
    if device.type != "cuda":
        sec = min(_timed(mm) for _ in range(2)) / k
        res["alone_ms"] = sec * 1e3
        res["tflops"] = flops / sec / 1e12
        res["note"] = "CPU: copies are synchronous clones, so there is nothing to overlap"
        return
    compute = torch.cuda.current_stream(device)

    def compute_ms() -> tuple[Any, Any]:
        return _cuda_span(compute, mm)

    torch.cuda.synchronize(device)
    e0, e1 = compute_ms()
    torch.cuda.synchronize(device)
    alone = e0.elapsed_time(e1) / k
    res["alone_ms"] = alone
    res["tflops"] = flops / (alone / 1e3) / 1e12
    flush()
    eng = _engines().CudaCopyEngine(device)
    x = torch.randint(0, 255, (n,), dtype=torch.uint8, device=device)
    host, ev = eng.offload([x])
    ev.synchronize()
    # enough copies each way to cover the compute window
    bw = 25e9
    copies = max(2, math.ceil(alone * k / 1e3 / (n / bw)) + 1)
    res["copies_per_direction"] = copies
    for mode in ("d2h", "h2d", "both"):
        torch.cuda.synchronize(device)
        marks = {}
        keep: list[Any] = []
        for lane, st in (("d2h", eng.d2h), ("h2d", eng.h2d)):
            ev0 = torch.cuda.Event(enable_timing=True)
            ev0.record(st)
            marks[lane] = [ev0]
        for _ in range(copies):  # queued before the matmuls: they wait on an idle compute stream
            if mode in ("d2h", "both"):
                h2, e2 = eng.offload([x])
                eng.recycle(h2, e2)
            if mode in ("h2d", "both"):
                keep.append(eng.reload(host, device, None)[0])
        for lane, st in (("d2h", eng.d2h), ("h2d", eng.h2d)):
            ev1 = torch.cuda.Event(enable_timing=True)
            ev1.record(st)
            marks[lane].append(ev1)
        c0, c1 = compute_ms()
        torch.cuda.synchronize(device)
        with_copies = c0.elapsed_time(c1) / k
        row: dict[str, Any] = {
            "matmul_ms": with_copies,
            "slowdown": with_copies / alone - 1.0,
        }
        for lane in ("d2h", "h2d") if mode == "both" else (mode,):
            s0, s1 = marks[lane]
            span = s0.elapsed_time(s1)
            row[f"{lane}_GBps"] = copies * n / (span / 1e3) / GB
            # did the copies run under the matmuls (start before they end)?
            row[f"{lane}_started_before_compute_end"] = s0.elapsed_time(c1) > 0
        res[mode] = row
        keep.clear()
        flush()
    eng.close()
