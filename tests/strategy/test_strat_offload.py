"""The activation store and offload manager on CPU: what moves, what stays, when device copies go.

The CUDA engine's stream and event rules are in test_strat_offload_cuda.py (marked gpu); here an
engine whose copies finish only when the test says so stands in for asynchronous copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from optpipe_lightning.schedule import Action
from optpipe_lightning.schedule.simulator import Timeline
from optpipe_lightning.strategy.runtime.copy_engines import (
    ALIGN,
    HostCopy,
    HostCopyEngine,
    PinnedPagePool,
    layout,
    pieces,
)
from optpipe_lightning.strategy.runtime.offload import (
    OffloadManager,
    OffloadStateError,
    StoreState,
    settle_points,
)

CPU = torch.device("cpu")


class _SlowEngine(HostCopyEngine):
    """Copies whose events complete only when ``finish`` is called; logs the compute waits."""

    def __init__(self) -> None:
        self.finished: set[int] = set()
        self.waits: list[Any] = []
        self.recycled: list[Any] = []
        self.n = 0

    def offload(self, flats: Sequence[torch.Tensor]) -> tuple[HostCopy, Any]:
        host, _ = super().offload(flats)
        self.n += 1
        return host, ("off", self.n)

    def reload(self, host: HostCopy, device: torch.device, after: Any) -> tuple[list[Any], Any]:
        bufs, _ = super().reload(host, device, after)
        self.n += 1
        return bufs, ("rel", self.n)

    def finish(self, event: Any) -> None:
        self.finished.add(event[1])

    def done(self, event: Any) -> bool:
        return event is None or event[1] in self.finished

    def wait(self, event: Any) -> None:
        self.waits.append(event)

    def recycle(self, host: HostCopy, event: Any) -> None:
        self.recycled.append(event)
        super().recycle(host, event)


def _reference_grads(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    ref_x = x.detach().clone().requires_grad_(True)
    torch.tanh(ref_x @ w.detach()).sum().backward()
    assert ref_x.grad is not None
    return ref_x.grad


def test_offload_moves_saved_tensors_and_restores_them() -> None:
    w = nn.Parameter(torch.randn(4, 4))
    mgr = OffloadManager(CPU, [w], min_bytes=0)
    key = (0, 0, 0)
    x = torch.randn(3, 4, requires_grad=True)
    with mgr.store(key).hooks():
        y = torch.tanh(x @ w).sum()
    st = mgr.stores[key]
    assert st.state is StoreState.SAVED
    assert any(s.keep for s in st.storages)  # the weight is saved by matmul and never moved
    mgr.offload(key)
    assert st.state is StoreState.OFFLOADED
    moved = [s for s in st.storages if not s.keep]
    assert moved and all(s.device is None and s.pending is None for s in moved)
    assert mgr.offloaded_total == sum(s.nbytes for s in moved) == st.moved_bytes
    with pytest.raises(OffloadStateError, match="RELOAD was not issued"):
        y.backward(retain_graph=True)
    mgr.reload(key)
    y.backward()
    assert x.grad is not None
    assert torch.equal(x.grad, _reference_grads(x, w))
    with pytest.raises(OffloadStateError, match="in state reloaded"):
        mgr.offload(key)
    mgr.release(key)
    assert key not in mgr.stores
    assert [h[0] for h in mgr.history] == ["OFFLOAD", "RELOAD"]


def test_views_of_one_storage_move_once_and_alias_again_after_the_reload() -> None:
    mgr = OffloadManager(CPU, [], min_bytes=0)
    key = (0, 1, 0)
    x = torch.randn(5, 12, requires_grad=True)
    with mgr.store(key).hooks():
        qkv = x * 2.0  # one storage
        q, k, v = qkv.split(4, dim=1)  # three non-contiguous views of it
        y = (q * k).sum() + (v.t() * v.t()).sum()
    st = mgr.stores[key]
    qkv_bytes = qkv.untyped_storage().nbytes()
    del qkv, q, k, v
    mgr.offload(key)
    assert st.moved_bytes == qkv_bytes  # moved once, whole, though four views were saved
    mgr.reload(key)
    y.backward()
    rebuilt = [sv.tensor for sv in st.saved if not st.storages[sv.storage].keep]
    assert len(rebuilt) == 4 and all(t is not None for t in rebuilt)
    assert len({t.untyped_storage().data_ptr() for t in rebuilt if t is not None}) == 1
    ref = x.detach().clone().requires_grad_(True)
    r = ref * 2.0
    a, b, c = r.split(4, dim=1)
    ((a * b).sum() + (c.t() * c.t()).sum()).backward()
    assert x.grad is not None and ref.grad is not None
    assert torch.equal(x.grad, ref.grad)


def test_storages_the_stage_holds_and_small_ones_are_never_moved() -> None:
    mgr = OffloadManager(CPU, [], min_bytes=64)
    key = (0, 0, 0)
    x = torch.randn(8, 8, requires_grad=True)  # 256 bytes: the stage's input
    small = torch.randn(3, requires_grad=True)  # 12 bytes: below min_bytes
    with mgr.store(key).hooks():
        h = torch.tanh(x)  # saves its output h
        out = torch.sigmoid(h * 3.0)  # saves out (the stage's output)
        y = out.sum() + (small * small).sum()
    mgr.keep_held(key, [x, out])
    st = mgr.stores[key]
    mgr.offload(key)
    assert st.moved_bytes == h.untyped_storage().nbytes()  # only h: not x, not out, not small
    mgr.reload(key)
    y.backward()
    assert x.grad is not None and small.grad is not None
    torch.testing.assert_close(small.grad, 2 * small.detach())


def test_device_copies_stay_until_the_copy_is_done_then_go() -> None:
    engine = _SlowEngine()
    mgr = OffloadManager(CPU, [], min_bytes=0, engine=engine)
    keys = [(0, i, 0) for i in range(3)]
    ys = []
    for k in keys:
        x = torch.randn(16, requires_grad=True)
        with mgr.store(k).hooks():
            ys.append(torch.exp(x).sum())
        mgr.offload(k)
    assert [st.key for st in mgr.pending] == keys  # no copy has finished: device copies kept
    assert all(s.pending is not None for s in mgr.stores[keys[0]].storages)
    engine.finish(mgr.stores[keys[1]].offload_event)
    mgr.poll()
    assert [st.key for st in mgr.pending] == [keys[0], keys[2]]
    assert all(s.pending is None for s in mgr.stores[keys[1]].storages)
    # the simulator says keys[0]'s copy has ended: compute waits on it, the device copy goes
    mgr.settle(keys[0])
    assert engine.waits == [mgr.stores[keys[0]].offload_event]
    assert [st.key for st in mgr.pending] == [keys[2]]
    # a reload waits on its offload's event; its pages go back with the reload's event
    mgr.reload(keys[2])
    assert engine.recycled == [mgr.stores[keys[2]].reload_event]
    ys[2].backward()  # the first unpack makes compute wait on the reload
    assert engine.waits[-1] == mgr.stores[keys[2]].reload_event
    # releasing a store whose offload copy may still run: compute waits on it first
    mgr.release(keys[2])
    assert engine.waits[-1] == ("off", 3)
    assert not mgr.pending
    mgr.reset()
    assert not mgr.stores


def test_reset_releases_stores_in_every_state() -> None:
    engine = _SlowEngine()
    mgr = OffloadManager(CPU, [], min_bytes=0, engine=engine)
    x = torch.randn(4, requires_grad=True)
    with mgr.store((0, 0, 0)).hooks():
        torch.exp(x)
    with mgr.store((0, 1, 0)).hooks():
        torch.exp(x)
    mgr.offload((0, 1, 0))
    mgr.store((0, 2, 0))
    mgr.reset()
    assert not mgr.stores and not mgr.pending and mgr.offloaded_total == 0
    assert ("off", 1) in engine.waits  # the pending copy was waited on before its source went


def test_store_reuse_and_unknown_keys_are_named_errors() -> None:
    mgr = OffloadManager(CPU, [], min_bytes=0)
    st = mgr.store((0, 0, 0))
    with st.hooks():
        pass
    with pytest.raises(OffloadStateError, match="reused in state saved"), st.hooks():
        pass
    with pytest.raises(OffloadStateError, match="whose forward was not recorded"):
        mgr.offload((0, 9, 0))
    with pytest.raises(OffloadStateError, match="never offloaded"):
        mgr.reload((0, 9, 0))
    with pytest.raises(OffloadStateError, match="RELOAD of"):
        mgr.reload((0, 0, 0))


def test_settle_points_pair_each_offload_with_the_first_action_after_its_copy() -> None:
    a = Action
    row = [a("F", 0), a("OFFLOAD", 0), a("F", 1), a("F", 2), a("B", 2), a("W", 2)]
    row += [a("RELOAD", 0), a("B", 1), a("W", 1), a("B", 0), a("W", 0)]
    # F 1 s each; the copy of mb 0 runs 1..2.5: F1 (1..2) and F2 (2..3) start before it ends
    start = np.array([0, 1, 1, 2, 3, 4, 5, 5, 6, 8, 9], dtype=float)
    end = np.array([1, 2.5, 2, 3, 4, 5, 7, 6, 7, 9, 10], dtype=float)
    tl = Timeline([row], [start], [end], [[]])
    assert settle_points(tl) == [[(4, 1)]]  # B2 is the first action starting at or after 2.5
    waited = Timeline([row], [start], [end], [[(3, 1)]])
    assert settle_points(waited) == [[(3, 1)]]  # a memory wait comes first
    late = Timeline([row], [start], [np.where(np.arange(11) == 1, 99.0, end)], [[]])
    assert settle_points(late) == [[]]  # ends after every action: the poll drops it


def test_pages_lay_out_aligned_storages_and_split_them_at_page_boundaries() -> None:
    offsets, total = layout([10, ALIGN, 1])
    assert offsets == [0, ALIGN, 2 * ALIGN] and total == 3 * ALIGN
    assert pieces(5, 20, 16) == [(0, 5, 0, 11), (1, 0, 11, 9)]
    assert pieces(32, 16, 16) == [(2, 0, 0, 16)]
    covered = sum(n for *_, n in pieces(7, 1000, 64))
    assert covered == 1000


class _Event:
    def __init__(self, done: bool) -> None:
        self.is_done = done

    def query(self) -> bool:
        return self.is_done


def test_the_page_pool_hands_out_finished_pages_first_and_the_events_of_the_rest() -> None:
    pool = PinnedPagePool(page_bytes=8)
    busy, free = _Event(False), _Event(True)
    a, b, c = (torch.zeros(8, dtype=torch.uint8) for _ in range(3))
    pool.give([a], busy)
    pool.give([b, c], free)
    pages, events = pool.take(16)  # two pages: the two whose reader is done, nothing to wait on
    assert {id(p) for p in pages} == {id(b), id(c)} and events == []
    pages, events = pool.take(8)
    assert pages[0] is a and events == [busy]  # a busy page comes with its event
    assert pool.free_pages == 0


# -- the CUDA engine's stream and event rules, with stand-in streams on CPU ---------------------


class _Log:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.current = "compute"
        self.events = 0  # events made under this log (ev1, ev2, ... per test)


class _FakeEvent:
    def __init__(self, log: _Log) -> None:
        log.events += 1
        self.name = f"ev{log.events}"
        self.log = log
        self.recorded_on: str | None = None

    def record(self, stream: Any) -> None:
        self.recorded_on = stream.name
        self.log.calls.append(f"{stream.name}.record({self.name})")

    def query(self) -> bool:
        return False

    def synchronize(self) -> None:
        self.log.calls.append(f"host.sync({self.name})")


class _FakeStream:
    def __init__(self, name: str, log: _Log) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: _FakeStream) -> None:
        self.log.calls.append(f"{self.name}.wait_stream({other.name})")

    def wait_event(self, ev: _FakeEvent) -> None:
        self.log.calls.append(f"{self.name}.wait_event({ev.name})")


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> _Log:
    """torch.cuda's streams and events replaced by recorders (the copies run on CPU)."""
    from contextlib import contextmanager

    log = _Log()
    compute = _FakeStream("compute", log)
    names = iter(["d2h", "h2d"])
    made: dict[str, _FakeStream] = {"compute": compute}

    def stream_ctor(device: Any = None) -> _FakeStream:
        s = _FakeStream(next(names), log)
        made[s.name] = s
        return s

    @contextmanager
    def use(s: _FakeStream) -> Any:
        prev, log.current = log.current, s.name
        try:
            yield
        finally:
            log.current = prev

    real_copy = torch.Tensor.copy_

    def copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        log.calls.append(f"{log.current}.copy({src.numel()}, non_blocking={non_blocking})")
        return real_copy(self, src)

    monkeypatch.setattr(torch.cuda, "Stream", stream_ctor)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: made[log.current])
    monkeypatch.setattr(torch.cuda, "stream", use)
    monkeypatch.setattr(torch.cuda, "Event", lambda **kw: _FakeEvent(log))
    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    return log


def test_the_cuda_engine_orders_its_copies_by_streams_and_events(fake_cuda: _Log) -> None:
    from optpipe_lightning.strategy.runtime.copy_engines import CudaCopyEngine

    log = fake_cuda
    pool = PinnedPagePool(page_bytes=1024, pin=False)
    eng = CudaCopyEngine(CPU, pool=pool)
    mgr = OffloadManager(CPU, [], min_bytes=0, engine=eng)
    x = torch.randn(100, 7, requires_grad=True)
    with mgr.store((0, 0, 0)).hooks():
        y = (torch.exp(x) * torch.sin(x)).sum()  # saves x, exp(x), sin(x): 3 x 2800 bytes
    mgr.offload((0, 0, 0))
    st = mgr.stores[(0, 0, 0)]
    assert st.moved_bytes == 3 * 2800 and pool.pages_allocated == 9  # 3 x 2816 aligned bytes
    off = log.calls[: log.calls.index("d2h.record(ev1)") + 1]
    assert off[0] == "d2h.wait_stream(compute)"  # after the forward that made them
    assert all(c.startswith("d2h.copy(") and "non_blocking=True" in c for c in off[1:-1])
    assert sum(int(c.split("(")[1].split(",")[0]) for c in off[1:-1]) == 3 * 2800
    assert mgr.pending and all(s.pending is not None for s in st.storages)  # ev1 not done
    log.calls.clear()
    mgr.reload((0, 0, 0))
    assert log.calls[:2] == ["h2d.wait_stream(compute)", "h2d.wait_event(ev1)"]
    assert all(c.startswith("h2d.copy(") for c in log.calls[2:-1])
    assert log.calls[-1] == "h2d.record(ev2)"
    assert pool.free_pages == 9  # back in the pool, with the reload's event
    log.calls.clear()
    y.backward()
    assert log.calls.count("compute.wait_event(ev2)") == 1  # once, at the first unpack
    torch.testing.assert_close(
        x.grad, torch.exp(x.detach()) * (torch.sin(x) + torch.cos(x)).detach()
    )
    log.calls.clear()
    mgr.release((0, 0, 0))
    assert log.calls == ["compute.wait_event(ev1)"]  # the offload's source goes only after it
    # a second offload takes the same pages and waits for the reload that last read them
    log.calls.clear()
    with mgr.store((0, 1, 0)).hooks():
        torch.exp(x).sum()
    mgr.offload((0, 1, 0))
    assert log.calls[:2] == ["d2h.wait_stream(compute)", "d2h.wait_event(ev2)"]
    assert pool.pages_allocated == 9


def test_a_half_duplex_channel_copies_both_ways_on_one_stream(fake_cuda: _Log) -> None:
    from optpipe_lightning.strategy.runtime.copy_engines import CudaCopyEngine

    eng = CudaCopyEngine(CPU, pool=PinnedPagePool(page_bytes=1024, pin=False), duplex=False)
    assert eng.h2d is eng.d2h
    mgr = OffloadManager(CPU, [], min_bytes=0, engine=eng)
    x = torch.randn(64, requires_grad=True)
    with mgr.store((0, 0, 0)).hooks():
        y = torch.exp(x).sum()
    mgr.offload((0, 0, 0))
    mgr.reload((0, 0, 0))
    assert all(c.startswith(("d2h.", "compute.")) for c in fake_cuda.calls)
    y.backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, torch.exp(x.detach()))


def test_a_reload_that_waits_for_memory_waits_on_that_offloads_copy(fake_cuda: _Log) -> None:
    """The simulator's reload wait on the CUDA engine: the waited offload's device copies go
    first (the compute stream waits on its copy, as at a settle point), then the reload's H2D
    stream waits on the compute stream, its own offload and the waited one."""
    from optpipe_lightning.strategy.runtime.copy_engines import CudaCopyEngine

    log = fake_cuda
    eng = CudaCopyEngine(CPU, pool=PinnedPagePool(page_bytes=1024, pin=False))
    mgr = OffloadManager(CPU, [], min_bytes=0, engine=eng)
    x = torch.randn(64, requires_grad=True)
    ys = []
    for mb in (0, 1):
        with mgr.store((0, mb, 0)).hooks():
            ys.append(torch.exp(x).sum())
        mgr.offload((0, mb, 0))
    first, second = (mgr.stores[(0, mb, 0)].offload_event.name for mb in (0, 1))
    assert mgr.holds_offload((0, 1, 0))  # its copy is not seen done
    log.calls.clear()
    mgr.reload((0, 0, 0), after=[(0, 1, 0)])
    # the wait is timed: an event recorded on the compute stream before it and one after it
    # (``settle_wait_seconds``)
    assert log.calls[0].startswith("compute.record(") and log.calls[2].startswith("compute.record(")
    # offload 1's copies can go: its room is the reload's
    assert log.calls[1] == f"compute.wait_event({second})"
    assert log.calls[3:6] == [
        "h2d.wait_stream(compute)",
        f"h2d.wait_event({first})",
        f"h2d.wait_event({second})",
    ]
    assert not mgr.holds_offload((0, 1, 0))
    ys[0].backward()
    torch.testing.assert_close(x.grad, torch.exp(x.detach()))
