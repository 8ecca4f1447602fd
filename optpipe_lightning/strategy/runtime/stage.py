"""A ``PipelineStage`` that follows this rank's action list: offload, reload, timing.

torch's runtime calls ``forward_one_chunk`` / ``backward_one_chunk`` /
``backward_weight_one_chunk`` in the order of our compute actions. The ``RankCursor`` (one per
rank, shared by the rank's chunks) walks the same list: before a compute action it checks that the
action is the one expected, after it issues the transfers listed behind it (the simulator's rule:
a transfer is issued when the compute action listed before it ends). Forwards of offloaded
activations run under their store's saved-tensor hooks; the store is released when W or BW ends.

With ``measure=True`` the cursor records the seconds of each compute action (CUDA events on GPU)
and the bytes autograd saves during each forward; with a ``memory`` watch (GPU) also what each
action leaves allocated and its transient (``op_memory``): that is the profiler's raw data.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch

from ...schedule import Action
from .module_state import preserved_state
from .offload import OffloadManager
from .op_memory import OpMemoryWatch
from .torch_adapter import PipelineStage


class ScheduleDivergenceError(RuntimeError):
    """torch ran a compute action other than the one our list has next (a bug, never silent)."""


class RankCursor:
    """This rank's action list for one step, and the side effects it implies."""

    def __init__(
        self,
        actions: Sequence[Action],
        offload: OffloadManager | None,
        device: torch.device,
        measure: bool = False,
        waits: Sequence[tuple[int, int]] = (),
        memory: OpMemoryWatch | None = None,
        reload_waits: Sequence[tuple[int, int]] = (),
    ) -> None:
        self.device = device
        self.offload = offload
        self.measure = measure  # time every compute action
        self.count_bytes = measure  # count the bytes each forward saves for backward
        # what each action leaves allocated (GPU profiling; ``op_memory``); on while ``measure``
        # is set through ``set_measure`` (not by calibration's op timing)
        self.memory = memory
        self.watch_memory = measure and memory is not None
        self.set_actions(actions, waits, reload_waits)
        # measurements: (op, chunk) -> list of seconds ; chunk -> list of saved bytes per forward
        self.times: dict[tuple[str, int], list[float]] = defaultdict(list)
        self.saved_bytes: dict[int, list[int]] = defaultdict(list)
        self.out_bytes: list[int] = []  # bytes of each measured forward's output (p2p size)
        # per layer (global index), while layers are instrumented: forward seconds, saved bytes
        self.current_layer: int | None = None
        self.layer_fwd: dict[int, list[float]] = defaultdict(list)
        self.layer_bytes: dict[int, int] = defaultdict(int)
        self.layer_byte_samples: dict[int, int] = defaultdict(int)
        self.layer_io: dict[int, str] = {}  # input and output shapes (a layer's identity)

    def set_measure(self, on: bool) -> None:
        self.measure = self.count_bytes = on
        self.watch_memory = on and self.memory is not None

    def drop_times(self) -> None:
        """Forget the op times and allocator samples measured so far (a warm-up step's), keep
        the byte counts."""
        self.times.clear()
        if self.memory is not None:
            self.memory.clear()

    def step_done(self) -> None:
        """The step's last action has run: its allocator window ends here."""
        if self.watch_memory and self.memory is not None:
            self.memory.close()

    def set_actions(
        self,
        actions: Sequence[Action],
        waits: Sequence[tuple[int, int]] = (),
        reload_waits: Sequence[tuple[int, int]] = (),
    ) -> None:
        """This rank's list, where its offloads leave the device, and which reloads wait for
        memory.

        ``waits``: (position of a compute action, position of an earlier OFFLOAD whose copy has
        ended before that action starts), from the simulator (``offload.settle_points``: its
        memory waits and the first action after each copy's end). ``reload_waits``: (position
        of a RELOAD, position of the earlier OFFLOAD it waits for), the simulator's
        ``Timeline.reload_waits``: such a reload is issued once that offload's device copies
        are gone (a poll saw its copy done, or the compute stream waited on it at its settle
        point), never before, and its host-to-device copy waits on that offload's event. Later
        reloads keep their list order behind it (one copy lane per direction)."""
        self.actions = list(actions)
        self.offloaded = {(a.mb, a.chunk) for a in self.actions if a.op == "OFFLOAD"}
        # per position, what torch must run there (compute) or None (a transfer); a list
        # without transfers skips the offload bookkeeping of every action (none can apply)
        self._expected: list[tuple[str, int, int] | None] = [
            (a.op, a.mb, a.chunk) if a.is_compute else None for a in self.actions
        ]
        self.has_transfers = any(key is None for key in self._expected)
        self.waits: dict[int, list[tuple[int, int, int]]] = {}
        settle_at: dict[int, int] = {}  # OFFLOAD position -> where its copies are dropped
        for f_pos, o_pos in waits:
            f, o = self.actions[f_pos], self.actions[o_pos]
            if not f.is_compute or o.op != "OFFLOAD" or o_pos >= f_pos:
                raise ValueError(
                    f"memory wait ({f_pos}, {o_pos}) does not pair a compute action with an "
                    "earlier OFFLOAD of this list"
                )
            self.waits.setdefault(f_pos, []).append((0, o.mb, o.chunk))
            settle_at[o_pos] = min(f_pos, settle_at.get(o_pos, f_pos))
        # RELOAD position -> the offloads whose room it waits for (each settles at the latest
        # at its settle point, which comes before the reload's backward)
        self.reload_gates: dict[int, list[tuple[int, int, int]]] = {}
        for r_pos, o_pos in reload_waits:
            r, o = self.actions[r_pos], self.actions[o_pos]
            if r.op != "RELOAD" or o.op != "OFFLOAD" or o_pos >= r_pos:
                raise ValueError(
                    f"reload wait ({r_pos}, {o_pos}) does not pair a RELOAD with an earlier "
                    "OFFLOAD of this list"
                )
            key = (0, o.mb, o.chunk)
            if o_pos not in settle_at:  # no point of its own: the next compute action settles it
                later = (
                    k for k in range(r_pos + 1, len(self.actions)) if self.actions[k].is_compute
                )
                gate = next(later, None)
                if gate is None:
                    raise ValueError(f"reload wait ({r_pos}, {o_pos}): no action after the RELOAD")
                self.waits.setdefault(gate, []).append(key)
                settle_at[o_pos] = gate
            self.reload_gates.setdefault(r_pos, []).append(key)
        self.reset()

    def reset(self) -> None:
        self.pos = 0
        if self.memory is not None:
            self.memory.discard()  # a window left open by a step that did not finish
        self._held: list[int] = []  # RELOAD positions issued later, in list order
        if self.offload is not None:
            self.offload.reset()
        self._t0: Any = None

    def finished(self) -> bool:
        return not self._held and all(key is None for key in self._expected[self.pos :])

    # -- around a compute action ---------------------------------------------------------------

    def begin(self, op: str, mb: int, chunk: int) -> None:
        if self.watch_memory and self.memory is not None:
            self.memory.begin(op, chunk)  # the previous action's window ends here
        if self.has_transfers:  # those listed before the first compute action: at time 0
            self._issue_transfers()
        if self.pos >= len(self.actions):
            raise ScheduleDivergenceError(f"torch ran {op}{mb}.{chunk} after the list ended")
        if self._expected[self.pos] != (op, mb, chunk):
            raise ScheduleDivergenceError(
                f"torch ran {op} mb {mb} chunk {chunk}, the schedule has "
                f"{self.actions[self.pos]} next"
            )
        if self.offload is not None and self.has_transfers:
            self.offload.poll()  # drop the device copies of finished offloads
            for key in self.waits.get(self.pos, ()):
                self.offload.settle(key)  # this action starts after that copy (simulator)
            self._issue_held()
        if self.measure:
            self._t0 = self._now()

    def end(self, op: str, mb: int, chunk: int) -> None:
        if self.measure:
            self.times[(op, chunk)].append(self._elapsed(self._t0))
        self.pos += 1
        if not self.has_transfers:
            return
        if op in ("W", "BW") and self.offload is not None:
            self.offload.release((0, mb, chunk))
        self._issue_transfers()

    def _issue_transfers(self) -> None:
        while self.pos < len(self.actions) and self._expected[self.pos] is None:
            a = self.actions[self.pos]
            if self.offload is None:
                raise ScheduleDivergenceError(f"schedule has {a} but offload is off")
            key = (0, a.mb, a.chunk)
            if a.op == "OFFLOAD":
                self.offload.offload(key)
            elif self._held or self.pos in self.reload_gates:
                self._held.append(self.pos)  # waits for memory (or behind one that does)
            else:
                self.offload.reload(key)
            self.pos += 1
        if self._held and self.offload is not None:
            self._issue_held()

    def _issue_held(self) -> None:
        """Issue the held reloads, in list order, whose offloads have left the device: a poll
        saw their copies done, or this action is where the compute stream waits on them."""
        assert self.offload is not None
        self.offload.poll()  # a copy seen done frees its room now
        while self._held:
            r_pos = self._held[0]
            keys = self.reload_gates.get(r_pos, [])
            if any(self.offload.holds_offload(k) for k in keys):
                return  # at the latest its gate's settle drops them (``set_actions``)
            self._held.pop(0)
            a = self.actions[r_pos]
            self.offload.reload((0, a.mb, a.chunk), after=keys)

    def held_by_stage(self, mb: int, chunk: int, cached: Any) -> None:
        """The stage keeps these (its inputs and outputs) until the backward: never moved."""
        if self.offload is not None and (mb, chunk) in self.offloaded and cached is not None:
            self.offload.keep_held((0, mb, chunk), _tensors(cached))

    def forward_context(self, mb: int, chunk: int) -> Any:
        if self.offload is not None and (mb, chunk) in self.offloaded:
            return self.offload.store((0, mb, chunk)).hooks()
        if self.count_bytes:
            return self._count_saved(chunk)
        return nullcontext()

    def _count_saved(self, chunk: int) -> Any:
        seen: set[tuple[int, int]] = set()
        total = [0]
        params = self.offload.param_ptrs if self.offload is not None else frozenset()

        def pack(t: torch.Tensor) -> torch.Tensor:
            st = t.untyped_storage()
            k = (st.data_ptr(), st.nbytes())
            if k not in seen and k[0] not in params:
                seen.add(k)
                total[0] += st.nbytes()
                if self.current_layer is not None:
                    self.layer_bytes[self.current_layer] += st.nbytes()
            return t

        cursor = self

        class _Ctx:
            def __enter__(self) -> None:
                self.h = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
                self.h.__enter__()

            def __exit__(self, *exc: object) -> None:
                self.h.__exit__(*exc)
                cursor.saved_bytes[chunk].append(total[0])

        return _Ctx()

    # -- clocks --------------------------------------------------------------------------------

    def _now(self) -> Any:
        if self.device.type == "cuda":  # pragma: no cover - GPU only
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            return ev
        return time.perf_counter()

    def _elapsed(self, t0: Any) -> float:
        if self.device.type == "cuda":  # pragma: no cover - GPU only
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            ev.synchronize()
            return float(t0.elapsed_time(ev)) / 1000.0
        return time.perf_counter() - float(t0)


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, tuple | list):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


class OptPipeStage(PipelineStage):
    """One chunk (layer group) of this rank, driven by the rank's cursor."""

    def __init__(
        self,
        submodule: torch.nn.Module,
        stage_index: int,
        num_stages: int,
        device: torch.device,
        group: Any,
        chunk: int,
        cursor: RankCursor,
    ) -> None:
        super().__init__(submodule, stage_index, num_stages, device, group=group)
        self.chunk = chunk
        self.cursor = cursor
        self._deferred_loss: dict[int, Any] = {}
        # the last layer group's latest forward output and its microbatch: torch computes the
        # loss from exactly this object (its first-step shape inference uses another one)
        self.last_output: Any = None
        self.last_output_mb = -1

    def _get_init_p2p_neighbors_ops(self) -> list[Any]:
        """torch's p2p warm-up, without the ops to a neighbour stage on this same rank.

        torch (2.9-2.12 at least) warms up a send and a receive with every neighbour stage at the
        first step, also one this rank holds itself (V-shape's turn, or a one-process group):
        a send to oneself, which gloo refuses ("Pair is not connected"). Such a neighbour hands
        its tensors over locally and needs no warm-up.
        """
        ops = super()._get_init_p2p_neighbors_ops()
        return [op for op in ops if getattr(op, "group_peer", None) != self.group_rank]

    def _prepare_forward_infra(self, *args: Any, **kwargs: Any) -> Any:
        """torch's shape inference (a forward before the first step, in training mode, on
        stand-in inputs past stage 0): it leaves no buffer changed and draws no random number
        (``module_state.preserved_state``), so no batch statistic or running count sees it."""
        with preserved_state([self.submod], self.device):
            return super()._prepare_forward_infra(*args, **kwargs)

    def _to_tensor(self, arg: Any) -> Any:
        """A stand-in input made from received metadata holds zeros, not uninitialised memory
        (torch 2.13+; deterministic, and no layer sees inf or NaN)."""
        out = super()._to_tensor(arg)
        if not isinstance(arg, torch.Tensor) and isinstance(out, torch.Tensor):
            with torch.no_grad():
                out.zero_()
        return out

    def forward_one_chunk(
        self, fwd_chunk_id: int, args: Any, kwargs: Any = None, *rest: Any, **kw: Any
    ) -> Any:
        self.cursor.begin("F", fwd_chunk_id, self.chunk)
        with self.cursor.forward_context(fwd_chunk_id, self.chunk):
            out = super().forward_one_chunk(fwd_chunk_id, args, kwargs, *rest, **kw)
        self.cursor.held_by_stage(fwd_chunk_id, self.chunk, self.fwd_cache.get(fwd_chunk_id))
        self.cursor.end("F", fwd_chunk_id, self.chunk)
        if self.is_last:
            self.last_output, self.last_output_mb = out, fwd_chunk_id
        if self.cursor.measure and isinstance(out, torch.Tensor):
            self.cursor.out_bytes.append(out.numel() * out.element_size())
        return out

    def _inputs_need_no_grad(self, bwd_chunk_id: int) -> bool:
        cached = self.fwd_cache.get(bwd_chunk_id)
        if cached is None:
            return False
        return not any(isinstance(t, torch.Tensor) and t.requires_grad for t in cached[1])

    def backward_one_chunk(
        self,
        bwd_chunk_id: int,
        loss: Any = None,
        full_backward: bool = True,
        last_backward: bool = False,
    ) -> None:
        op = "BW" if full_backward else "B"
        self.cursor.begin(op, bwd_chunk_id, self.chunk)
        if (
            not full_backward
            and self.has_backward
            and not self.is_first
            and self._inputs_need_no_grad(bwd_chunk_id)
        ):
            # torch's input-gradient pass finds no path from inputs to weights here (the
            # previous stages have no trainable parameters) and its W would then compute
            # nothing. Do what torch does for stage 0: no input gradient now, the whole
            # backward at W.
            self._deferred_loss[bwd_chunk_id] = loss
            meta = getattr(self, "_stage_meta", None)
            n_in = (
                len(meta.inputs)
                if meta is not None and meta.inputs is not None
                else len(self.fwd_cache[bwd_chunk_id][1])
            )
            self.bwd_cache[bwd_chunk_id] = tuple(None for _ in range(n_in))
        else:
            super().backward_one_chunk(
                bwd_chunk_id, loss=loss, full_backward=full_backward, last_backward=last_backward
            )
        self.cursor.end(op, bwd_chunk_id, self.chunk)

    def backward_weight_one_chunk(self, bwd_chunk_id: int, last_backward: bool = False) -> None:
        self.cursor.begin("W", bwd_chunk_id, self.chunk)
        if bwd_chunk_id in self._deferred_loss:
            loss = self._deferred_loss.pop(bwd_chunk_id)
            had = bwd_chunk_id in self.bwd_cache
            super().backward_one_chunk(
                bwd_chunk_id, loss=loss, full_backward=True, last_backward=last_backward
            )
            if not had:  # the (empty) input gradients were already sent after the I
                self.bwd_cache.pop(bwd_chunk_id, None)
        else:
            super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)
        self.cursor.end("W", bwd_chunk_id, self.chunk)
