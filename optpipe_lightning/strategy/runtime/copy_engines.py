"""How activation bytes move between the device and the host: one engine per device kind.

An engine moves a list of flat ``uint8`` device tensors (whole storages, see ``offload.py``) to
the host and back, and hands out the events that say when a copy is done. Two engines with the
same interface:

- ``CudaCopyEngine``: one copy stream per direction (device-to-host and host-to-device), so an
  offload and a reload run at the same time on the GPU's two copy engines over full-duplex PCIe,
  as the cost model assumes (``offload.duplex``, default true; with ``false`` both directions
  share one stream, one copy at a time, as the model then assumes). Host memory is pinned pages from a
  ``PinnedPagePool`` reused across microbatches and steps. The CUDA semantics it relies on:

  * offload: the D2H stream waits on the compute stream (the forward that made the activation
    has ended: the simulator's "an offload starts when its F ends"); ``non_blocking`` copies into
    pinned pages; an event on the D2H stream marks the end. The caller keeps the device tensors
    until that event has completed (or until the compute stream waited on it), so the caching
    allocator never hands their blocks to new work while the copy still reads them (no
    ``record_stream``: ``memory_allocated`` then says what the device really holds).
  * reload: device buffers are allocated on the compute stream (blocks stay in the compute
    stream's pool, so memory freed by compute is reused, no cross-stream fragmentation); the
    H2D stream waits on the compute stream (those blocks' earlier users are done, and the reload
    starts when the action before it ends: the simulator's issue rule), on the offload's event
    (the host copy is complete) and on the events of the offloads the reload waits for memory
    (``also``: the simulator's ``reload_waits``); an event on the H2D stream marks the end; compute waits
    on it once, at the first unpack of the backward.
  * pages go back to the pool with the event of their last reader; the next offload that takes
    them makes the D2H stream wait on it before writing.

- ``HostCopyEngine``: synchronous clones (CPU and gloo runs); every event is ``None`` and
  already complete, so the bookkeeping above is walked by the CPU tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

PAGE_BYTES = 16 << 20  # one pinned page; a power of two, so torch's host allocator wastes none
ALIGN = 512  # byte alignment of each storage inside the pages


@dataclass
class HostCopy:
    """Where one store's storages sit on the host."""

    sizes: list[int]  # bytes of each storage, in order
    pages: list[torch.Tensor] = field(default_factory=list)  # pinned uint8 pages (CUDA)
    offsets: list[int] = field(default_factory=list)  # start of each storage in the pages
    clones: list[torch.Tensor] = field(default_factory=list)  # plain copies (CPU)

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)


def layout(sizes: Sequence[int], align: int = ALIGN) -> tuple[list[int], int]:
    """Start of each storage when laid end to end (each aligned), and the total bytes."""
    offsets, pos = [], 0
    for n in sizes:
        offsets.append(pos)
        pos += -(-n // align) * align
    return offsets, pos


def pieces(start: int, nbytes: int, page_bytes: int) -> list[tuple[int, int, int, int]]:
    """(page, offset in page, offset in the storage, length) of bytes [start, start+nbytes)."""
    out = []
    done = 0
    while done < nbytes:
        pos = start + done
        page, off = divmod(pos, page_bytes)
        n = min(nbytes - done, page_bytes - off)
        out.append((page, off, done, n))
        done += n
    return out


class HostCopyEngine:
    """Synchronous copies (CPU): the 'host' copy is a clone; events are ``None`` (complete)."""

    def offload(self, flats: Sequence[torch.Tensor]) -> tuple[HostCopy, Any]:
        return HostCopy([int(f.numel()) for f in flats], clones=[f.clone() for f in flats]), None

    def reload(
        self, host: HostCopy, device: torch.device, after: Any, also: Sequence[Any] = ()
    ) -> tuple[list[torch.Tensor], Any]:
        return [c.to(device, copy=True) for c in host.clones], None

    def done(self, event: Any) -> bool:
        return True

    def wait(self, event: Any) -> None:
        """Make later compute wait for ``event`` (nothing to wait for on CPU)."""

    def timed_wait(self, event: Any) -> Callable[[], float]:
        """``wait``, timed on the host (the time it blocked)."""
        t0 = time.perf_counter()
        self.wait(event)
        waited = time.perf_counter() - t0
        return lambda: waited

    def synchronize(self, event: Any) -> None:
        """Block the host until ``event`` (nothing to wait for on CPU)."""

    def recycle(self, host: HostCopy, event: Any) -> None:
        host.clones.clear()

    def close(self) -> None:
        """Nothing is held."""


class PinnedPagePool:
    """Pinned host pages of one size, reused: a page taken for an offload comes back with the
    event of its last reader (the reload), which the next writer's stream waits on."""

    def __init__(self, page_bytes: int = PAGE_BYTES, pin: bool = True) -> None:
        self.page_bytes = page_bytes
        self.pin = pin  # False only for tests of the bookkeeping on a machine without CUDA
        self._free: list[tuple[torch.Tensor, Any]] = []
        self.pages_allocated = 0

    @property
    def held_bytes(self) -> int:
        return self.pages_allocated * self.page_bytes

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def take(self, nbytes: int) -> tuple[list[torch.Tensor], list[Any]]:
        """Pages covering ``nbytes``, and the events to wait on before writing them."""
        need = -(-nbytes // self.page_bytes)
        # pages whose last reader is done go first (popped from the end) and need no wait; pages
        # come back in groups sharing one event, so each event is queried once
        done: dict[int, bool] = {}

        def ready(ev: Any) -> bool:
            if ev is None:
                return True
            if id(ev) not in done:
                done[id(ev)] = bool(ev.query())
            return done[id(ev)]

        marked = [(p, ev, ready(ev)) for p, ev in self._free]
        marked.sort(key=lambda x: x[2])
        pages: list[torch.Tensor] = []
        events: list[Any] = []
        while len(pages) < need and marked:
            page, ev, ok = marked.pop()
            pages.append(page)
            if not ok and all(e is not ev for e in events):
                events.append(ev)
        self._free = [(p, ev) for p, ev, _ in marked]
        while len(pages) < need:
            pages.append(torch.empty(self.page_bytes, dtype=torch.uint8, pin_memory=self.pin))
            self.pages_allocated += 1
        return pages, events

    def give(self, pages: Sequence[torch.Tensor], event: Any) -> None:
        self._free.extend((p, event) for p in pages)

    def clear(self) -> None:
        """Drop the free pages (pages lent out come back to the pool as usual)."""
        self.pages_allocated -= len(self._free)
        self._free.clear()


class CudaCopyEngine:  # pragma: no cover - exercised on GPU machines (tests marked gpu)
    """A D2H and an H2D stream, pinned pages, events (the module docstring gives the rules)."""

    def __init__(
        self, device: torch.device, pool: PinnedPagePool | None = None, duplex: bool = True
    ) -> None:
        self.device = device
        self.d2h = torch.cuda.Stream(device=device)
        # a half-duplex channel (``offload.duplex: false``) runs one copy at a time: one stream
        self.h2d = torch.cuda.Stream(device=device) if duplex else self.d2h
        self.pool = pool if pool is not None else PinnedPagePool()

    def _compute(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def offload(self, flats: Sequence[torch.Tensor]) -> tuple[HostCopy, Any]:
        sizes = [int(f.numel()) for f in flats]
        offsets, total = layout(sizes)
        pages, ready = self.pool.take(total)
        self.d2h.wait_stream(self._compute())
        for ev in ready:
            self.d2h.wait_event(ev)
        pb = self.pool.page_bytes
        with torch.cuda.stream(self.d2h):
            for flat, start, n in zip(flats, offsets, sizes, strict=True):
                for page, off, src, k in pieces(start, n, pb):
                    pages[page][off : off + k].copy_(flat[src : src + k], non_blocking=True)
        event = torch.cuda.Event()
        event.record(self.d2h)
        return HostCopy(sizes, pages=pages, offsets=offsets), event

    def reload(
        self, host: HostCopy, device: torch.device, after: Any, also: Sequence[Any] = ()
    ) -> tuple[list[torch.Tensor], Any]:
        # allocated here, on the compute stream: the blocks stay in the compute stream's pool
        bufs = [torch.empty(n, dtype=torch.uint8, device=device) for n in host.sizes]
        self.h2d.wait_stream(self._compute())
        for ev in (after, *also):  # its own offload, and those it waits for memory (``also``)
            if ev is not None:
                self.h2d.wait_event(ev)
        pb = self.pool.page_bytes
        with torch.cuda.stream(self.h2d):
            for buf, start, n in zip(bufs, host.offsets, host.sizes, strict=True):
                for page, off, dst, k in pieces(start, n, pb):
                    buf[dst : dst + k].copy_(host.pages[page][off : off + k], non_blocking=True)
        event = torch.cuda.Event()
        event.record(self.h2d)
        return bufs, event

    def done(self, event: Any) -> bool:
        return event is None or bool(event.query())

    def wait(self, event: Any) -> None:
        if event is not None:
            self._compute().wait_event(event)

    def timed_wait(self, event: Any) -> Callable[[], float]:
        """``wait``, timed on the compute stream: events just before and after it; their gap
        is the stall (readable once the stream has passed the second)."""
        if event is None:
            return lambda: 0.0
        before = torch.cuda.Event(enable_timing=True)
        after = torch.cuda.Event(enable_timing=True)
        comp = self._compute()
        before.record(comp)
        comp.wait_event(event)
        after.record(comp)
        return lambda: before.elapsed_time(after) / 1e3

    def synchronize(self, event: Any) -> None:
        if event is not None:
            event.synchronize()

    def recycle(self, host: HostCopy, event: Any) -> None:
        self.pool.give(host.pages, event)
        host.pages = []

    def close(self) -> None:
        self.pool.clear()
