"""Activation offload: one store per (stage, microbatch, chunk), moved as the schedule says.

The forward of an offloaded (stage, mb, chunk) runs inside ``store.hooks()``
(``torch.autograd.graph.saved_tensors_hooks``): every tensor autograd saves is handed to the store,
which keeps it and returns a handle. ``OFFLOAD`` copies the kept tensors to the host and drops the
device references; ``RELOAD`` copies them back; the backward's unpack returns the reloaded tensor
(waiting once on the reload). The store is released when the microbatch's W (or BW) ends: split
backward unpacks in both I and W (torch's I keeps the graph).

Two backends with the same bookkeeping:

- ``CudaCopyEngine``: pinned host buffers, one copy stream, events; the copy stream waits on the
  compute stream before an offload, the compute stream waits on the reload event at first unpack.
  A forward that the schedule has wait for an offload (the simulator's memory wait) starts only
  once that copy's event has completed on the host, so the caching allocator can reuse the
  offloaded blocks for the forward's activations.
- ``HostCopyEngine``: synchronous clones (CPU / gloo runs), so tests walk the same states.

Parameters (matched by storage) and tensors below ``min_bytes`` are not moved: they stay as they
are (a parameter is kept by the model anyway).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch


class StoreState(enum.Enum):
    NEW = "new"
    SAVING = "saving"
    SAVED = "saved"
    OFFLOADED = "offloaded"
    RELOADED = "reloaded"
    RELEASED = "released"


class OffloadStateError(RuntimeError):
    """A transfer came out of order (a bug: the simulator checked the schedule)."""


@dataclass
class _Entry:
    device_tensor: torch.Tensor | None
    host_tensor: torch.Tensor | None = None
    keep: bool = False  # parameter or small tensor: never moved


class HostCopyEngine:
    """Synchronous copies; on CPU the 'host' copy is a clone (bookkeeping identical to GPU)."""

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu", copy=True)

    def to_device(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        return t.to(device, copy=True)

    def after_offload(self) -> Any:
        return None

    def after_reload(self) -> Any:
        return None

    def wait(self, event: Any) -> None:
        return None

    def synchronize(self, event: Any) -> None:
        return None


class CudaCopyEngine:  # pragma: no cover - exercised on GPU machines only
    """Pinned host buffers and a copy stream; compute waits on events, not on the whole device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=True)
            host.copy_(t, non_blocking=True)
        t.record_stream(self.stream)
        return host

    def to_device(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        buf = torch.empty(t.size(), dtype=t.dtype, device=device)  # on the compute stream
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            buf.copy_(t, non_blocking=True)
        buf.record_stream(self.stream)
        return buf

    def after_offload(self) -> Any:
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev

    def after_reload(self) -> Any:
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev

    def wait(self, event: Any) -> None:
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    def synchronize(self, event: Any) -> None:
        """Block the host until the copy is done: the allocator frees a block used on the copy
        stream only once the host sees that stream's work completed."""
        if event is not None:
            event.synchronize()


@dataclass
class ActivationStore:
    """The saved tensors of one (stage, microbatch, chunk), and where they are."""

    key: tuple[int, int, int]
    engine: Any
    device: torch.device
    param_ptrs: frozenset[int]
    min_bytes: int = 0
    state: StoreState = StoreState.NEW
    entries: list[_Entry] = field(default_factory=list)
    moved_bytes: int = 0
    _by_view: dict[tuple[Any, ...], int] = field(default_factory=dict)
    _reload_event: Any = None
    _offload_event: Any = None
    _waited: bool = False

    # -- pack / unpack --------------------------------------------------------------------------

    def _pack(self, t: torch.Tensor) -> int:
        ptr = t.untyped_storage().data_ptr()
        view_key = (ptr, tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)
        hit = self._by_view.get(view_key)
        if hit is not None:
            return hit
        keep = ptr in self.param_ptrs or t.numel() * t.element_size() < self.min_bytes
        self.entries.append(_Entry(device_tensor=t, keep=keep))
        idx = len(self.entries) - 1
        self._by_view[view_key] = idx
        return idx

    def _unpack(self, handle: int) -> torch.Tensor:
        e = self.entries[handle]
        if e.device_tensor is None:
            raise OffloadStateError(
                f"activation {self.key} used by backward while still on the host "
                f"(state {self.state.value}): its RELOAD was not issued before the backward"
            )
        if not self._waited:
            self.engine.wait(self._reload_event)
            self._waited = True
        return e.device_tensor

    @contextmanager
    def hooks(self) -> Iterator[None]:
        if self.state is not StoreState.NEW:
            raise OffloadStateError(f"store {self.key} reused in state {self.state.value}")
        self.state = StoreState.SAVING
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield
        self.state = StoreState.SAVED
        self._by_view.clear()

    # -- transfers ------------------------------------------------------------------------------

    def offload(self) -> None:
        if self.state is not StoreState.SAVED:
            raise OffloadStateError(f"OFFLOAD of {self.key} in state {self.state.value}")
        moved = 0
        for e in self.entries:
            if e.keep or e.device_tensor is None:
                continue
            t = e.device_tensor
            e.host_tensor = self.engine.to_host(t)
            moved += t.numel() * t.element_size()
            e.device_tensor = None
        self._offload_event = self.engine.after_offload()
        self.moved_bytes = moved
        self.state = StoreState.OFFLOADED

    def reload(self) -> None:
        if self.state is not StoreState.OFFLOADED:
            raise OffloadStateError(f"RELOAD of {self.key} in state {self.state.value}")
        for e in self.entries:
            if e.host_tensor is not None:
                e.device_tensor = self.engine.to_device(e.host_tensor, self.device)
                e.host_tensor = None
        self._reload_event = self.engine.after_reload()
        self._waited = False
        self.state = StoreState.RELOADED

    def release(self) -> None:
        self.entries.clear()
        self.state = StoreState.RELEASED


class OffloadManager:
    """All stores of one rank for one step; created fresh every step."""

    def __init__(self, device: torch.device, params: list[torch.nn.Parameter], min_bytes: int = 0):
        self.device = device
        self.engine: Any = CudaCopyEngine(device) if device.type == "cuda" else HostCopyEngine()
        self.param_ptrs = frozenset(p.untyped_storage().data_ptr() for p in params)
        self.min_bytes = min_bytes
        self.stores: dict[tuple[int, int, int], ActivationStore] = {}
        self.offloaded_total = 0  # bytes moved to host this step
        self.history: list[tuple[str, tuple[int, int, int], int]] = []  # (op, key, bytes)

    def reset(self) -> None:
        for st in self.stores.values():
            st.release()
        self.stores.clear()
        self.offloaded_total = 0
        self.history.clear()

    def store(self, key: tuple[int, int, int]) -> ActivationStore:
        st = self.stores.get(key)
        if st is None:
            st = ActivationStore(key, self.engine, self.device, self.param_ptrs, self.min_bytes)
            self.stores[key] = st
        return st

    def offload(self, key: tuple[int, int, int]) -> None:
        st = self.stores.get(key)
        if st is None:
            raise OffloadStateError(f"OFFLOAD of {key} whose forward was not recorded")
        st.offload()
        self.offloaded_total += st.moved_bytes
        self.history.append(("OFFLOAD", key, st.moved_bytes))

    def wait_offloaded(self, key: tuple[int, int, int]) -> None:
        """The memory wait: block until the offload of ``key`` has left the device."""
        st = self.stores.get(key)
        if st is None or st.state not in (StoreState.OFFLOADED, StoreState.RELOADED):
            state = "unknown" if st is None else f"in state {st.state.value}"
            raise OffloadStateError(f"a forward waits for the offload of {key}, {state}")
        self.engine.synchronize(st._offload_event)
        self.history.append(("WAIT", key, st.moved_bytes))

    def reload(self, key: tuple[int, int, int]) -> None:
        st = self.stores.get(key)
        if st is None:
            raise OffloadStateError(f"RELOAD of {key} that was never offloaded")
        st.reload()
        self.history.append(("RELOAD", key, st.moved_bytes))

    def release(self, key: tuple[int, int, int]) -> None:
        st = self.stores.pop(key, None)
        if st is not None:
            st.release()
