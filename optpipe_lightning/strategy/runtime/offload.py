"""Activation offload: one store per (stage, microbatch, chunk), moved as the schedule says.

The forward of an offloaded (stage, mb, chunk) runs inside ``store.hooks()``
(``torch.autograd.graph.saved_tensors_hooks``): every tensor autograd saves is handed to the store,
which keeps it and returns a handle. Tensors are grouped by the storage they view: a storage is
moved once, whole, as flat bytes (so ``q``, ``k`` and ``v`` split from one projection, or a tensor
and its transpose, move once and alias again after the reload, and a non-contiguous view needs no
temporary copy on the device). Kept as they are, never moved: parameters (matched by storage),
storages below ``min_bytes``, tensors on another device or of another layout, and the storages the
pipeline stage itself holds until the backward (its inputs and outputs: moving them frees
nothing).

``OFFLOAD`` copies the moved storages to the host; the device copies are dropped when the copy has
completed (``poll``) or when the compute stream has waited on it (``settle``: the executor does
this before the action the simulator has start after the copy ends, so the device holds what the
simulator says it holds). ``RELOAD`` copies them back into buffers allocated on the compute stream;
the backward's unpack rebuilds each saved view from them, and the compute stream waits once on
the reload. The store is released when the microbatch's W (or BW) ends: torch's input-gradient
pass keeps the graph (``retain_graph``), so both I and W unpack. States: new -> saving -> saved ->
offloaded -> reloaded -> released; anything out of order raises ``OffloadStateError``.

The copies themselves are the engine's (``copy_engines.py``): CUDA streams, one per direction,
pinned pages and events on GPU; synchronous clones on CPU.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from ...schedule.simulator import Timeline
from .copy_engines import CudaCopyEngine, HostCopy, HostCopyEngine

Key = tuple[int, int, int]


def settle_points(timeline: Timeline) -> list[list[tuple[int, int]]]:
    """Per stage, (position of a compute action, position of an OFFLOAD): where the executor
    drops that offload's device copies, making the compute stream wait on the copy.

    Each OFFLOAD pairs with the earliest of: the F that the simulator has wait for it (a memory
    wait: that F ends when the copy ends), and the first compute action listed after it that the
    simulator starts at or after the copy's end. When the copies run as fast as the problem says,
    these waits cost nothing; the device then frees what the simulator frees, in the order it
    frees it (the caching allocator sees frees in the order the host issues them, not when the
    GPU gets there). An offload whose copy ends after the stage's last compute action has no
    point: ``OffloadManager.poll`` drops it once done."""
    out: list[list[tuple[int, int]]] = []
    for s, row in enumerate(timeline.actions):
        start, end = timeline.start[s], timeline.end[s]
        scale = max(float(abs(end).max()) if len(end) else 0.0, 1e-30)
        compute = [k for k, a in enumerate(row) if a.is_compute]
        best: dict[int, int] = {}
        for o, a in enumerate(row):
            if a.op != "OFFLOAD":
                continue
            done = float(end[o]) - 1e-9 * scale
            k = next((k for k in compute if k > o and float(start[k]) >= done), None)
            if k is not None:
                best[o] = k
        if timeline.memory_waits:
            for f, o in timeline.memory_waits[s]:
                best[o] = min(f, best.get(o, f))
        out.append(sorted((k, o) for o, k in best.items()))
    return out


class StageWaits(NamedTuple):
    """What one stage's executor waits for: ``settle`` (position of a compute action, position
    of an OFFLOAD whose device copies go before it: ``settle_points``) and ``reloads``
    (position of a RELOAD, position of the OFFLOAD whose memory it waits for: the simulator's
    ``Timeline.reload_waits``)."""

    settle: list[tuple[int, int]]
    reloads: list[tuple[int, int]]


def execution_waits(timeline: Timeline) -> list[StageWaits]:
    """Per stage, the waits the executor honours (``RankCursor.set_actions``)."""
    settle = settle_points(timeline)
    reloads = timeline.reload_waits or [[] for _ in timeline.actions]
    return [StageWaits(a, list(b)) for a, b in zip(settle, reloads, strict=True)]


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
class _Storage:
    """One device storage that the forward's saved tensors view, moved as flat bytes."""

    nbytes: int
    device: torch.Tensor | None  # flat uint8 over the storage: before offload / after reload
    keep: bool = False  # stays on the device (never moved)
    pending: torch.Tensor | None = None  # the device copy an unfinished offload still reads


@dataclass
class _Saved:
    """One tensor autograd saved: a view of one of the store's storages (index ``storage``)."""

    storage: int
    tensor: torch.Tensor | None  # the original (until offload) or the view rebuilt after reload
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


def _storage_ptr(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


@dataclass
class ActivationStore:
    """The saved tensors of one (stage, microbatch, chunk), and where they are."""

    key: Key
    engine: Any
    device: torch.device
    param_ptrs: frozenset[int]
    min_bytes: int = 0
    state: StoreState = StoreState.NEW
    saved: list[_Saved] = field(default_factory=list)
    storages: list[_Storage] = field(default_factory=list)
    moved_bytes: int = 0
    offload_event: Any = None
    reload_event: Any = None
    _by_ptr: dict[int, int] = field(default_factory=dict)
    _host: HostCopy | None = None
    _waited: bool = False

    # -- pack / unpack --------------------------------------------------------------------------

    def _movable(self, t: torch.Tensor, nbytes: int, ptr: int) -> bool:
        return (
            ptr != 0
            and ptr not in self.param_ptrs
            and nbytes >= max(self.min_bytes, 1)
            and t.device == self.device
            and t.layout == torch.strided
            and type(t) in (torch.Tensor, torch.nn.Parameter)
            and not (t.is_conj() or t.is_neg())
        )

    def _pack(self, t: torch.Tensor) -> int:
        st = t.untyped_storage()
        ptr, nbytes = int(st.data_ptr()), int(st.nbytes())
        idx = self._by_ptr.get(ptr) if ptr else None
        if idx is None:
            keep = not self._movable(t, nbytes, ptr)
            flat = None if keep else torch.empty(0, dtype=torch.uint8, device=t.device).set_(st)
            self.storages.append(_Storage(nbytes, flat, keep=keep))
            idx = len(self.storages) - 1
            if ptr:
                self._by_ptr[ptr] = idx
        self.saved.append(
            _Saved(idx, t, t.dtype, tuple(t.size()), tuple(t.stride()), int(t.storage_offset()))
        )
        return len(self.saved) - 1

    def _unpack(self, handle: int) -> torch.Tensor:
        s = self.saved[handle]
        if s.tensor is not None:
            if self.state is StoreState.RELOADED and not self._waited:
                self.engine.wait(self.reload_event)
                self._waited = True
            return s.tensor
        if self.state is not StoreState.RELOADED:
            raise OffloadStateError(
                f"activation {self.key} used by backward while still on the host "
                f"(state {self.state.value}): its RELOAD was not issued before the backward"
            )
        if not self._waited:
            self.engine.wait(self.reload_event)  # once: the reload has landed
            self._waited = True
        buf = self.storages[s.storage].device
        assert buf is not None
        s.tensor = torch.empty(0, dtype=s.dtype, device=buf.device).set_(
            buf.untyped_storage(), s.offset, s.size, s.stride
        )
        return s.tensor

    @contextmanager
    def hooks(self) -> Iterator[None]:
        if self.state is not StoreState.NEW:
            raise OffloadStateError(f"store {self.key} reused in state {self.state.value}")
        self.state = StoreState.SAVING
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield
        self.state = StoreState.SAVED

    def keep_held(self, tensors: Iterable[Any]) -> None:
        """Never move the storages of ``tensors`` (the stage holds them until the backward)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                idx = self._by_ptr.get(_storage_ptr(t))
                if idx is not None:
                    self.storages[idx].keep = True
                    self.storages[idx].device = None

    # -- transfers ------------------------------------------------------------------------------

    def offload(self) -> None:
        if self.state is not StoreState.SAVED:
            raise OffloadStateError(f"OFFLOAD of {self.key} in state {self.state.value}")
        moved = [s for s in self.storages if not s.keep]
        flats = [s.device for s in moved]
        assert all(f is not None for f in flats)
        self._host, self.offload_event = self.engine.offload(flats)
        for s in moved:
            s.pending, s.device = s.device, None
        for sv in self.saved:
            if not self.storages[sv.storage].keep:
                sv.tensor = None
        self._by_ptr.clear()
        self.moved_bytes = sum(s.nbytes for s in moved)
        self.state = StoreState.OFFLOADED

    def drop_pending(self) -> None:
        """Drop the device copies the offload read (call once the copy is done, or once the
        compute stream has waited on it)."""
        for s in self.storages:
            s.pending = None

    @property
    def has_pending(self) -> bool:
        return any(s.pending is not None for s in self.storages)

    def reload(self, wait_for: Sequence[Any] = ()) -> None:
        """Copy the moved storages back; the copy also waits on the events ``wait_for`` (the
        offloads this reload waits for memory)."""
        if self.state is not StoreState.OFFLOADED:
            raise OffloadStateError(f"RELOAD of {self.key} in state {self.state.value}")
        moved = [s for s in self.storages if not s.keep]
        assert self._host is not None
        if wait_for:
            bufs, self.reload_event = self.engine.reload(
                self._host, self.device, self.offload_event, also=wait_for
            )
        else:
            bufs, self.reload_event = self.engine.reload(
                self._host, self.device, self.offload_event
            )
        for s, b in zip(moved, bufs, strict=True):
            s.device = b
        # the pages are free once the reload has read them; the next writer waits on that
        self.engine.recycle(self._host, self.reload_event)
        self._host = None
        self._waited = False
        self.state = StoreState.RELOADED

    def release(self) -> None:
        """Drop everything (the end of W/BW, or of the step); safe at any state."""
        if self.has_pending:
            self.engine.wait(self.offload_event)  # later compute must not overwrite a copy's source
        if self.state is StoreState.RELOADED and not self._waited:
            self.engine.wait(self.reload_event)
        if self._host is not None:
            self.engine.recycle(self._host, self.offload_event)
            self._host = None
        self.saved.clear()
        self.storages.clear()
        self._by_ptr.clear()
        self.state = StoreState.RELEASED


class OffloadManager:
    """All stores of one rank; ``reset`` at every step."""

    def __init__(
        self,
        device: torch.device,
        params: list[torch.nn.Parameter],
        min_bytes: int = 0,
        engine: Any = None,
        duplex: bool = True,
    ) -> None:
        self.device = device
        if engine is None:
            cuda = device.type == "cuda"
            engine = CudaCopyEngine(device, duplex=duplex) if cuda else HostCopyEngine()
        self.engine: Any = engine
        self.param_ptrs = frozenset(_storage_ptr(p) for p in params)
        self.min_bytes = min_bytes
        self.stores: dict[Key, ActivationStore] = {}
        self.pending: list[ActivationStore] = []  # offloaded, device copies not yet dropped
        self.offloaded_total = 0  # bytes moved to host this step
        self.history: list[tuple[str, Key, int]] = []  # (op, key, bytes)
        # each wait at a settle point: a function giving the seconds compute waited there
        # (``settle_wait_seconds``; on a GPU readable once the compute stream has passed it)
        self.settle_waits: list[Callable[[], float]] = []

    def reset(self) -> None:
        for st in self.stores.values():
            st.release()
        self.stores.clear()
        self.pending.clear()
        self.offloaded_total = 0
        self.history.clear()
        self.settle_waits.clear()

    def settle_wait_seconds(self) -> float:
        """Seconds compute waited at settle points (and reload gates) since ``reset``: the
        host's blocked time on CPU, the compute stream's stall between two events on a GPU
        (synchronize first). A copy that runs late shows here, not in memory."""
        return sum(f() for f in self.settle_waits)

    def close(self) -> None:
        """Release everything, and the host memory the engine keeps for reuse."""
        self.reset()
        self.engine.close()

    def store(self, key: Key) -> ActivationStore:
        st = self.stores.get(key)
        if st is None:
            st = ActivationStore(key, self.engine, self.device, self.param_ptrs, self.min_bytes)
            self.stores[key] = st
        return st

    def keep_held(self, key: Key, tensors: Iterable[Any]) -> None:
        st = self.stores.get(key)
        if st is not None:
            st.keep_held(tensors)

    def offload(self, key: Key) -> None:
        st = self.stores.get(key)
        if st is None:
            raise OffloadStateError(f"OFFLOAD of {key} whose forward was not recorded")
        st.offload()
        self.offloaded_total += st.moved_bytes
        self.history.append(("OFFLOAD", key, st.moved_bytes))
        self.pending.append(st)
        self.poll()

    def poll(self) -> None:
        """Drop the device copies of the offloads that have completed (a cheap event query)."""
        if not self.pending:
            return
        still = []
        for st in self.pending:
            if self.engine.done(st.offload_event):
                st.drop_pending()
            else:
                still.append(st)
        self.pending = still

    def settle(self, key: Key) -> None:
        """The offload of ``key`` has left the device before the compute that follows: the
        compute stream waits on its copy (the host does not block) and its device copies go,
        so the allocator can hand their blocks to that compute."""
        st = self.stores.get(key)
        if st is None or st.state not in (StoreState.OFFLOADED, StoreState.RELOADED):
            state = "unknown" if st is None else f"in state {st.state.value}"
            raise OffloadStateError(f"an action waits for the offload of {key}, {state}")
        if st.has_pending:
            timed = getattr(self.engine, "timed_wait", None)
            if timed is not None:
                self.settle_waits.append(timed(st.offload_event))
            else:
                self.engine.wait(st.offload_event)
            st.drop_pending()
            self.pending = [p for p in self.pending if p is not st]
        self.history.append(("WAIT", key, st.moved_bytes))

    def synchronize(self) -> None:
        """Block the host until every offload issued so far has completed (tests, benchmarks)."""
        for st in self.pending:
            self.engine.synchronize(st.offload_event)
        self.poll()

    def holds_offload(self, key: Key) -> bool:
        """Whether the device copies an offload of ``key`` reads are still held."""
        st = self.stores.get(key)
        return st is not None and st.has_pending

    def device_bytes(self) -> int:
        """Bytes of moved storages this rank's stores hold on the device now: before their
        offload, still read by an unfinished one, or reloaded (what the schedule's offloads and
        reloads change; tests compare it with the simulator's memory)."""
        total = 0
        for st in self.stores.values():
            for sg in st.storages:
                if not sg.keep and (sg.device is not None or sg.pending is not None):
                    total += sg.nbytes
        return total

    def reload(self, key: Key, after: Iterable[Key] = ()) -> None:
        """Copy ``key``'s activations back. ``after``: offloads this reload waits for (the
        simulator's ``reload_waits``): their device copies go first (the compute stream waits
        on any copy still running, as at a settle point), so the reload's buffers take their
        room, and the host-to-device copy waits on their events."""
        st = self.stores.get(key)
        if st is None:
            raise OffloadStateError(f"RELOAD of {key} that was never offloaded")
        events = []
        for k in after:
            waited = self.stores.get(k)
            if waited is None:
                continue  # released already: nothing of it left on the device
            if waited.has_pending:
                self.settle(k)
            if waited.offload_event is not None:
                events.append(waited.offload_event)
        st.reload(events)
        self.history.append(("RELOAD", key, st.moved_bytes))

    def release(self, key: Key) -> None:
        st = self.stores.pop(key, None)
        if st is not None:
            st.release()
            self.pending = [p for p in self.pending if p is not st]
