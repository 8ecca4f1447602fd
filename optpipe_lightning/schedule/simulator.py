"""The one simulator: times a schedule exactly, checks it, and measures it.

Event-driven over integer op ids. Each stage runs its compute actions in list order, each as early
as its dependencies allow (an F needs the previous layer group's F, plus ``t_comm`` of the sending
stage when that group is on another device; a B needs its own F and the next group's B, plus comm;
a W needs its B; a B of an offloaded activation needs its RELOAD). Transfers run one at a time per
copy lane (``lanes``: with ``offload.duplex`` a channel's OFFLOADs and RELOADs run on two lanes at
once, else on one), in list order per stage and lane, issued when the compute action listed before
them ends; on a lane shared by several stages the ready transfer that can start first goes first
(ties: lower stage).

Memory (per stage, activations only, starting at 0): F adds ``m_f`` when it ends, B adds ``m_b``
and W ``m_w`` when they end (a BW both), an OFFLOAD frees its bytes when it ends, a RELOAD
allocates them when it starts. Changes at the same instant net out before the limit is checked.

Memory wait: an F whose allocation would not fit when it ends is delayed until it fits, but only
by the stage's own OFFLOADs listed before it: it ends no earlier than the earliest of their ends
that makes it fit (the executor waits on that copy). If none does, it runs as early as its list
position allows and the memory violation is reported. With duplex lanes a RELOAD waits the same
way: one whose bytes would not fit when it would start starts when the earliest offload of its
stage listed before it that makes them fit ends (``Timeline.reload_waits``). A schedule that fits
without waiting is timed exactly as without these rules.

The same function is the validator: a schedule with missing or duplicate ops, an order that cannot
progress (deadlock), a reload after its B, an offload of an activation that is not there, or
memory above the limit at any instant is reported with every violation by name.
"""

from __future__ import annotations

import gc
import itertools
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np

from .lanes import is_duplex, stage_lanes
from .problem import Problem
from .schedule import COMPUTE_KINDS, Action, Evaluation, Schedule, Violation

_KIND_CODE = {"F": 0, "B": 1, "W": 2, "BW": 3, "OFFLOAD": 4, "RELOAD": 5}
_KIND_NAME = ("F", "B", "W", "BW", "OFFLOAD", "RELOAD")
MEMORY_TOLERANCE = 1e-9  # relative slack on the memory limit (float sums of byte counts)


@dataclass
class Timeline:
    """Start and end of every action, per stage, in list order."""

    actions: list[list[Action]]
    start: list[np.ndarray]
    end: list[np.ndarray]
    # per stage, (index of an F, index of the OFFLOAD it waited for) in list positions: the
    # memory waits the executor must honour (it waits on that copy before the F)
    memory_waits: list[list[tuple[int, int]]] = field(default_factory=list)
    # the same for RELOADs (duplex lanes only): (index of a RELOAD, index of the OFFLOAD it
    # waited for); the executor's host-to-device copy must wait on that offload's completion
    reload_waits: list[list[tuple[int, int]]] = field(default_factory=list)

    def compute_rows(self, stage: int) -> list[tuple[Action, float, float]]:
        return [
            (a, float(s), float(e))
            for a, s, e in zip(self.actions[stage], self.start[stage], self.end[stage], strict=True)
            if a.op in COMPUTE_KINDS
        ]

    def transfer_rows(self, stage: int) -> list[tuple[Action, float, float]]:
        return [
            (a, float(s), float(e))
            for a, s, e in zip(self.actions[stage], self.start[stage], self.end[stage], strict=True)
            if a.op not in COMPUTE_KINDS
        ]


@dataclass
class MemoryCurve:
    """Step curve of one stage's activation memory: ``bytes[i]`` holds from ``times[i]`` on."""

    times: np.ndarray
    bytes: np.ndarray
    offloaded: np.ndarray  # bytes of this stage's activations sitting on the host, same steps

    @property
    def peak(self) -> float:
        return float(self.bytes.max()) if self.bytes.size else 0.0

    def peak_time(self) -> float:
        return float(self.times[int(np.argmax(self.bytes))]) if self.bytes.size else 0.0


@dataclass
class SimResult:
    evaluation: Evaluation
    timeline: Timeline | None = None
    memory: list[MemoryCurve] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return self.evaluation.feasible

    @property
    def makespan(self) -> float | None:
        return self.evaluation.makespan


def evaluate(problem: Problem, schedule: Schedule | Sequence[Sequence[Action]]) -> Evaluation:
    """The evaluation of a schedule (what every tool reports beside it)."""
    return simulate(problem, schedule).evaluation


def evaluated(problem: Problem, schedule: Schedule) -> Schedule:
    """The schedule with the simulator's evaluation attached."""
    return schedule.with_evaluation(evaluate(problem, schedule))


def simulate(problem: Problem, schedule: Schedule | Sequence[Sequence[Action]]) -> SimResult:
    """Time, validate and measure a schedule on a problem."""
    if isinstance(schedule, Schedule):
        if schedule.problem_hash != problem.hash:
            raise ScheduleMismatchError(
                f"schedule was made for problem {schedule.problem_hash}, not {problem.hash}"
            )
        actions: Sequence[Sequence[Action]] = schedule.actions
    else:
        actions = schedule
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the simulator allocates many small objects and frees none until it returns
    try:
        limited = any(x is not None for x in problem.memory_limits())
        if limited and _shared_channels(problem):
            # On a shared channel, a forward held back to learn whether it must wait can change
            # which ready copy goes first; a schedule that fits without any wait keeps exactly
            # the timing it has without the rule (docs/formats.md), so try that first.
            plain = _Simulator(problem, actions, memory_wait=False).run()
            if plain.feasible or plain.timeline is None:
                return plain
        elif limited and is_duplex(problem):
            # With duplex lanes a reload's wait counts only the ops listed before it, and ops
            # listed after it may already have freed memory: where a reload waited, a schedule
            # that fits without any wait keeps the timing it has without the rule. (Without
            # reload waits the two timings are the same wherever that one fits: a forward
            # waits only where it would break the limit.)
            res = _Simulator(problem, actions).run()
            if res.timeline is None or not any(res.timeline.reload_waits):
                return res
            plain = _Simulator(problem, actions, memory_wait=False).run()
            return plain if plain.feasible else res
        return _Simulator(problem, actions).run()
    finally:
        if gc_was_enabled:
            gc.enable()


def _shared_channels(problem: Problem) -> bool:
    chan = problem.channel_of()
    return len(set(chan)) < len(chan)


class ScheduleMismatchError(ValueError):
    """The schedule belongs to another problem."""


class _Simulator:
    """One run of the simulator over flat integer op ids (all stages' actions concatenated)."""

    def __init__(
        self, problem: Problem, actions: Sequence[Sequence[Action]], memory_wait: bool = True
    ) -> None:
        self.memory_wait = memory_wait
        self.pb = problem
        self.actions = [list(row) for row in actions]
        self.violations: list[Violation] = []

    # ---- structure ---------------------------------------------------------------------------

    def _encode(self) -> bool:
        """Flat arrays of every action and the op-key table; False if the structure is broken."""
        pb = self.pb
        p, m, v = pb.num_stages, pb.num_microbatches, pb.num_chunks
        viol = self.violations
        if len(self.actions) != p:
            viol.append(
                Violation(
                    kind="missing-op" if len(self.actions) < p else "unknown-op",
                    message=f"schedule has {len(self.actions)} stages, problem has {p}",
                )
            )
            return False
        lengths = [len(r) for r in self.actions]
        self.offset = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        n = int(self.offset[-1])
        self.n = n
        code = np.empty(n, dtype=np.int64)
        mb = np.empty(n, dtype=np.int64)
        ch = np.empty(n, dtype=np.int64)
        for s, row in enumerate(self.actions):
            if not row:
                continue
            lo, hi = int(self.offset[s]), int(self.offset[s + 1])
            ops, mbs, chunks = zip(*row, strict=True)
            code[lo:hi] = np.fromiter(
                map(_KIND_CODE.get, ops, itertools.repeat(-1)), dtype=np.int64, count=hi - lo
            )
            mb[lo:hi] = np.fromiter(mbs, dtype=np.int64, count=hi - lo)
            ch[lo:hi] = np.fromiter(chunks, dtype=np.int64, count=hi - lo)
        stage = np.repeat(np.arange(p, dtype=np.int64), lengths)
        self.code, self.mb, self.ch, self.stage = code, mb, ch, stage
        ids = np.arange(n, dtype=np.int64)
        ok = (code >= 0) & (mb >= 0) & (mb < m) & (ch >= 0) & (ch < v)
        for i in np.flatnonzero(~ok):
            s = int(stage[i])
            a = self.actions[s][i - int(self.offset[s])]
            viol.append(
                Violation(
                    kind="unknown-op",
                    stage=s,
                    message=f"stage {s} action {i - int(self.offset[s])} {a}: no such op "
                    f"(microbatches 0..{m - 1}, chunks 0..{v - 1})",
                )
            )
        keys = ((stage * v + ch) * m + mb) * 6 + code
        pos = np.full(p * v * m * 6, -1, dtype=np.int64)
        pos[keys[ok]] = ids[ok]
        dup = ok & (pos[np.where(ok, keys, 0)] != ids)
        for i in np.flatnonzero(dup):
            s = int(stage[i])
            a = self.actions[s][i - int(self.offset[s])]
            viol.append(
                Violation(kind="duplicate-op", stage=s, message=f"stage {s} runs {a} twice")
            )
        P = pos.reshape(p, v, m, 6)
        self.P = P
        has = P >= 0
        hf, hb, hw, hbw, ho, hr = (has[..., k] for k in range(6))

        def report(mask: np.ndarray, kind: str, text: str) -> None:
            for s, c, j in np.argwhere(mask):
                name = f"(mb {j}" + (f", chunk {c})" if v > 1 else ")")
                viol.append(Violation(kind=kind, stage=int(s), message=text.format(s=s, name=name)))

        report(~hf, "missing-op", "stage {s} has no F {name}")
        report(hbw & (hb | hw), "duplicate-op", "stage {s} has BW and also B or W {name}")
        report(~hbw & ~hb & ~hw, "missing-op", "stage {s} has no B and W (or BW) {name}")
        report(~hbw & hb & ~hw, "missing-op", "stage {s} has no W {name}")
        report(~hbw & ~hb & hw, "missing-op", "stage {s} has no B {name}")
        moved = ho | hr
        if pb.offload is None:
            report(
                moved,
                "offload-not-allowed",
                "stage {s} moves {name} but the problem has offload: null",
            )
        else:
            report(ho & ~hr, "offload-unpaired", "stage {s} has OFFLOAD without RELOAD {name}")
            report(hr & ~ho, "offload-unpaired", "stage {s} has RELOAD without OFFLOAD {name}")
            pair = ho & hr
            pf, po, pr = P[..., 0], P[..., 4], P[..., 5]
            pback = np.where(hb, P[..., 1], P[..., 3])
            report(
                pair & hf & (po < pf), "offload-not-there", "stage {s} offloads {name} before its F"
            )
            report(
                pair & (pr < po),
                "offload-not-there",
                "stage {s} reloads {name} before offloading it",
            )
            report(
                pair & (pback >= 0) & (pr > pback),
                "reload-after-use",
                "stage {s} reloads {name} after its backward",
            )
        return not viol

    def _dependencies(self) -> None:
        """Up to three dependencies per op (the first two with a lag); the sentinel op ``n`` has
        always ended, so a missing dependency costs nothing in the event loop."""
        pb = self.pb
        p, _m, v = pb.num_stages, pb.num_microbatches, pb.num_chunks
        n, P = self.n, self.P
        code, mb, ch, stage = self.code, self.mb, self.ch, self.stage
        G = p * v
        grp = np.array([[pb.group_of(s, c) for c in range(v)] for s in range(p)], dtype=np.int64)
        table = np.array(pb.group_table, dtype=np.int64)  # [g] -> (stage, chunk)
        t_comm = pb.cost("t_comm")
        g = grp[stage, ch]
        d = np.full((3, n), n, dtype=np.int64)
        lag = np.zeros((2, n))  # the third dependency (a reload) never has a lag
        # F: previous group's F
        isF = (code == 0) & (g > 0)
        gp = np.where(isF, g - 1, 0)
        ps, pc = table[gp, 0], table[gp, 1]
        d[0] = np.where(isF, P[ps, pc, mb, 0], d[0])
        lag[0] = np.where(isF & (ps != stage), t_comm[ps, pc], 0.0)
        # B / BW: own F, next group's B (or BW), own RELOAD
        isB = (code == 1) | (code == 3)
        d[0] = np.where(isB, P[stage, ch, mb, 0], d[0])
        nxt = isB & (g < G - 1)
        gn = np.where(nxt, g + 1, 0)
        ns, nc = table[gn, 0], table[gn, 1]
        nb = P[ns, nc, mb, 1]
        nb = np.where(nb >= 0, nb, P[ns, nc, mb, 3])
        d[1] = np.where(nxt, nb, d[1])
        lag[1] = np.where(nxt & (ns != stage), t_comm[ns, nc], 0.0)
        rl = P[stage, ch, mb, 5]
        d[2] = np.where(isB & (rl >= 0), rl, d[2])
        # W: own B
        isW = code == 2
        d[0] = np.where(isW, P[stage, ch, mb, 1], d[0])
        # transfers: own F (offload) or own OFFLOAD (reload), and the issue point
        isO, isR = code == 4, code == 5
        d[0] = np.where(isO, P[stage, ch, mb, 0], d[0])
        d[0] = np.where(isR, P[stage, ch, mb, 4], d[0])
        is_c = code <= 3
        last = np.maximum.accumulate(np.where(is_c, np.arange(n), -1)) if n else np.zeros(0, int)
        own = last >= self.offset[stage]
        issue = np.where(own, last, n)
        d[1] = np.where(isO | isR, issue, d[1])
        self.dep, self.lag = d, lag
        # durations
        pbk = pb.cost("offload_bytes")
        d2h = pb.offload.d2h_bandwidth if pb.offload else 1.0
        h2d = pb.offload.h2d_bandwidth if pb.offload else 1.0
        tf, tb, tw = pb.cost("t_f"), pb.cost("t_b"), pb.cost("t_w")
        D = np.stack([tf, tb, tw, pb.cost("t_bw"), pbk / d2h, pbk / h2d])
        self.dur = D[code, stage, ch]
        self.is_compute = is_c

    def _memory_tables(
        self, duplex: bool
    ) -> tuple[list[float], list[bool], list[bool], list[int], list[int], list[float], list[float]]:
        """For the memory wait: each op's memory delta, whether it is an OFFLOAD, whether it is
        an allocating F, and per op the number of its stage's transfers listed before it on its
        first transfer queue (every transfer; with ``duplex`` the OFFLOADs) and on its second
        (with ``duplex`` the RELOADs; else none), the reload bytes listed before it, and the
        memory change of the compute ops listed before it."""
        pb = self.pb
        code, stage, ch, n = self.code, self.stage, self.ch, self.n
        m_f, m_b, m_w = pb.cost("m_f"), pb.cost("m_b"), pb.cost("m_w")
        pbk = pb.cost("offload_bytes")
        DM = np.stack([m_f, m_b, m_w, m_b + m_w, -pbk, pbk])
        delta = DM[code, stage, ch]
        is_r = (code == 5).astype(np.int64)
        is_q0 = (code == 4).astype(np.int64) if duplex else (~self.is_compute).astype(np.int64)
        is_q1 = is_r if duplex else np.zeros(n, dtype=np.int64)
        # transfers before each op, counted over all stages (made per stage below)
        before0 = np.cumsum(is_q0) - is_q0
        before1 = np.cumsum(is_q1) - is_q1
        rel = np.where(code == 5, pbk[stage, ch], 0.0)
        rbefore = np.cumsum(rel) - rel
        comp = np.where(self.is_compute, delta, 0.0)
        cbefore = np.cumsum(comp) - comp
        if n:
            first = self.offset[stage]
            before0 = before0 - before0[first]
            before1 = before1 - before1[first]
            rbefore = rbefore - rbefore[first]
            cbefore = cbefore - cbefore[first]
        return (
            delta.tolist(),
            (code == 4).tolist(),
            ((code == 0) & (delta > 0)).tolist(),
            before0.tolist(),
            before1.tolist(),
            rbefore.tolist(),
            cbefore.tolist(),
        )

    def run(self) -> SimResult:
        pb = self.pb
        p = pb.num_stages
        limits = pb.memory_limits()
        ok = self._encode()
        num_off = int((self.code == 4).sum()) if hasattr(self, "code") else 0
        if not ok:
            return SimResult(
                Evaluation(
                    feasible=False,
                    makespan=None,
                    memory_limit=limits,
                    num_offloaded=num_off,
                    violations=self.violations,
                )
            )
        self._dependencies()
        timed = self._time()
        if timed is None:
            return SimResult(
                Evaluation(
                    feasible=False,
                    makespan=None,
                    memory_limit=limits,
                    num_offloaded=num_off,
                    violations=self.violations,
                )
            )
        start, end = timed
        off = self.offset
        starts = [start[off[s] : off[s + 1]] for s in range(p)]
        ends = [end[off[s] : off[s + 1]] for s in range(p)]
        waits: list[list[tuple[int, int]]] = [[] for _ in range(p)]
        reload_waits: list[list[tuple[int, int]]] = [[] for _ in range(p)]
        for w_op, o_op in sorted(self.waited.items()):
            s = int(self.stage[w_op])
            pair = (w_op - int(off[s]), o_op - int(off[s]))
            (reload_waits if self.code[w_op] == 5 else waits)[s].append(pair)
        timeline = Timeline(self.actions, starts, ends, waits, reload_waits)
        n = self.n
        makespan = float(end.max() - start.min()) if n else 0.0
        is_c = self.is_compute
        work = np.bincount(self.stage[is_c], weights=(end - start)[is_c], minlength=p)
        # per-stage segment reductions (flat ids are stage-major; empty stages give +-inf)
        first_f = np.full(p, np.inf)
        last_end = np.full(p, -np.inf)
        nonempty = off[1:] > off[:-1]
        if nonempty.any():
            seg = off[:-1][nonempty]
            first_f[nonempty] = np.minimum.reduceat(np.where(self.code == 0, start, np.inf), seg)
            last_end[nonempty] = np.maximum.reduceat(np.where(is_c, end, -np.inf), seg)
        spans = np.where(np.isfinite(first_f) & np.isfinite(last_end), last_end - first_f, 0.0)
        bubble = 1.0 - float(work.sum()) / (p * makespan) if makespan > 0 else 0.0
        s_max = int(np.argmax(spans))
        span = float(spans[s_max])
        span_rate = (span - float(work[s_max])) / span if span > 0 else 0.0
        curves = self._memory(start, end)
        peaks = [c.peak for c in curves]
        for s, (curve, lim) in enumerate(zip(curves, limits, strict=True)):
            if lim is None:
                continue
            over = curve.bytes > lim * (1 + MEMORY_TOLERANCE) + 1e-6
            if over.any():
                i = int(np.argmax(over))
                self.violations.append(
                    Violation(
                        kind="memory",
                        stage=s,
                        time=float(curve.times[i]),
                        message=f"stage {s} holds {curve.bytes[i]:.6g} bytes of activations at "
                        f"t={curve.times[i]:.6g}s, over its limit {lim:.6g} "
                        f"(peak {curve.peak:.6g} at t={curve.peak_time():.6g}s)",
                    )
                )
        ev = Evaluation(
            feasible=not self.violations,
            makespan=makespan,
            bubble_rate=bubble,
            stage_span_bubble_rate=span_rate,
            peak_memory=peaks,
            memory_limit=limits,
            num_offloaded=num_off,
            violations=self.violations,
        )
        return SimResult(ev, timeline, curves)

    def _time(self) -> tuple[np.ndarray, np.ndarray] | None:
        """ASAP start and end of every op; None (with a deadlock violation) if stuck."""
        pb = self.pb
        p, n = pb.num_stages, self.n
        dep = self.dep
        is_c = self.is_compute
        off = self.offset.tolist()
        end = [-1.0] * (n + 1)
        end[n] = 0.0  # sentinel: "no dependency"
        start = [0.0] * n

        def per_stage_rows(ids: np.ndarray, columns: tuple[np.ndarray, ...]) -> list[list[Any]]:
            """Per stage, ``(op, *columns[op])`` tuples of the given ops, built in one pass (flat
            ids are stage-major, so each stage's ops are one slice)."""
            cuts = np.searchsorted(ids, off).tolist()
            flat = list(zip(ids.tolist(), *(x[ids].tolist() for x in columns), strict=True))
            return [flat[cuts[s] : cuts[s + 1]] for s in range(p)]

        # compute ops as (op, dep0, dep1, dep2, lag0, lag1, duration): dep2, a reload, has no lag
        comp_rows = per_stage_rows(np.flatnonzero(is_c), (*self.dep, *self.lag, self.dur))
        # transfers as (op, dep0, dep1, lag0, lag1, duration), per transfer queue: queue 2s
        # holds stage s's OFFLOADs (and its RELOADs unless duplex), queue 2s + 1 its RELOADs
        # when duplex; each queue keeps list order and runs on one lane
        duplex = is_duplex(pb)
        stage_xfers = per_stage_rows(np.flatnonzero(~is_c), (*self.dep[:2], *self.lag, self.dur))
        xfer_rows: list[list[Any]] = [[] for _ in range(2 * p)]
        codes = self.code.tolist()
        for s, rows in enumerate(stage_xfers):
            if duplex:
                for r in rows:
                    xfer_rows[2 * s + (codes[r[0]] == 5)].append(r)
            else:
                xfer_rows[2 * s] = rows
        xfer_q = [[r[0] for r in rows] for rows in xfer_rows]
        comp_ptr = [0] * p
        xfer_ptr = [0] * (2 * p)
        dev_free = [0.0] * p
        lanes = stage_lanes(pb)
        chan_members: dict[int, list[int]] = {}  # lane -> its queues, by stage
        for q, rows in enumerate(xfer_rows):
            if rows:
                chan_members.setdefault(lanes[q // 2][q % 2], []).append(q)
        chan_free = dict.fromkeys(chan_members, 0.0)
        # memory wait (see the module docstring): per stage the compute ops' running level, and
        # the timed transfers' memory events (time, cumulative delta, is-offload) in list order,
        # which is also time order since a stage's transfers run one at a time in list order
        # (a stage without transfers has no offload to wait for: its F's never wait)
        cap = [
            None
            if lim is None or not self.memory_wait or not (xfer_q[2 * s] or xfer_q[2 * s + 1])
            else lim * (1 + MEMORY_TOLERANCE) + 1e-6
            for s, lim in enumerate(pb.memory_limits())
        ]
        if any(c is not None for c in cap):
            mdelta, is_off, waits_for_memory, xbefore, xbefore1, rbefore, cbefore = (
                self._memory_tables(duplex)
            )
        # with duplex lanes a RELOAD may wait for memory too (``reload_start``)
        reload_waits = [duplex and c is not None for c in cap]
        comp_level = [0.0] * p
        # per transfer queue (a queue's transfers are timed in list order and in time order)
        xev_t: list[list[float]] = [[] for _ in range(2 * p)]
        xev_cum: list[list[float]] = [[] for _ in range(2 * p)]
        xev_off: list[list[bool]] = [[] for _ in range(2 * p)]
        reloaded = [0.0] * p  # bytes of the stage's timed reloads
        waited: dict[int, int] = {}  # F or RELOAD op -> the OFFLOAD op it waited for
        self.waited = waited
        waiters: dict[int, list[int]] = {}
        # work items: s >= 0 = compute queue of stage s; -1 - c = copy lane c
        work: list[int] = [-1 - c for c in chan_members] + list(range(p - 1, -1, -1))
        in_work = set(work)
        done = 0

        def wait_on(b: int, item: int) -> None:
            lst = waiters.get(b)
            if lst is None:
                waiters[b] = [item]
            elif item not in lst:
                lst.append(item)

        def wake(op: int) -> None:
            lst = waiters.pop(op, None)
            if lst:
                for item in lst:
                    if item not in in_work:
                        in_work.add(item)
                        work.append(item)

        def first_blocker(op: int) -> int:
            """The first dependency of ``op`` that has not ended (-1: none); deadlock reports."""
            for b in (int(dep[0, op]), int(dep[1, op]), int(dep[2, op])):
                if end[b] < 0:
                    return b
            return -1

        def record(op: int, q: int, t: float, e: float) -> None:
            """A timed transfer's memory event on its queue ``q`` (offload: -bytes at its end;
            reload: +bytes at its start)."""
            dm = mdelta[op]
            cum = xev_cum[q]
            cum.append((cum[-1] if cum else 0.0) + dm)
            if is_off[op]:
                xev_t[q].append(e)
                xev_off[q].append(True)
            else:
                xev_t[q].append(t)
                xev_off[q].append(False)
                reloaded[q // 2] += dm

        def memory_start(s: int, op: int, t: float, du: float) -> tuple[float, int]:
            """Start of F ``op`` (ready at ``t``) under the memory wait, and -1; or (t, the op
            id of an earlier-listed transfer of the stage that must be timed first)."""
            if duplex:
                return memory_start_duplex(s, op, t, du)
            lim = cap[s]
            assert lim is not None
            base = comp_level[s] + mdelta[op]
            nb = xbefore[op]
            q = 2 * s
            times, cum = xev_t[q], xev_cum[q]
            ntimed = len(times)
            tau = t + du
            if ntimed < nb:
                # not all earlier transfers are timed: decide now only if it fits even when
                # every earlier reload has allocated and no untimed offload has freed
                i = bisect_right(times, tau)
                lvl = base + (cum[i - 1] if i else 0.0) + rbefore[op] - reloaded[s]
                if lvl <= lim:
                    return t, -1
                return t, xfer_q[q][ntimed]
            i = bisect_right(times, tau, 0, nb)
            if base + (cum[i - 1] if i else 0.0) <= lim:
                return t, -1
            offs = xev_off[q]
            k = i
            while k < nb:
                if offs[k]:
                    tk = times[k]
                    j = k + 1
                    while j < nb and times[j] <= tk:
                        j += 1
                    if base + cum[j - 1] <= lim:  # tk > t + du: a real wait
                        waited[op] = xfer_q[q][k]
                        return tk - du, -1
                    k = j
                else:
                    k += 1
            return t, -1  # no earlier offload makes it fit: the violation is reported

        def memory_start_duplex(s: int, op: int, t: float, du: float) -> tuple[float, int]:
            """``memory_start`` where the stage's OFFLOADs (queue 2s) and RELOADs (queue
            2s + 1) run on lanes of their own: each queue's events are in time order, not the
            two together."""
            lim = cap[s]
            assert lim is not None
            base = comp_level[s] + mdelta[op]
            qo, qr = 2 * s, 2 * s + 1
            no, nr = xbefore[op], xbefore1[op]
            to, co = xev_t[qo], xev_cum[qo]
            tr, cr = xev_t[qr], xev_cum[qr]
            tau = t + du
            if len(to) < no or len(tr) < nr:
                # as in ``memory_start``: fits even with every earlier reload allocated and no
                # untimed offload freed, or wait until the next untimed one is timed
                i, j = bisect_right(to, tau), bisect_right(tr, tau)
                lvl = base + (co[i - 1] if i else 0.0) + (cr[j - 1] if j else 0.0)
                if lvl + rbefore[op] - reloaded[s] <= lim:
                    return t, -1
                return t, (xfer_q[qo][len(to)] if len(to) < no else xfer_q[qr][len(tr)])
            i, j = bisect_right(to, tau, 0, no), bisect_right(tr, tau, 0, nr)
            if base + (co[i - 1] if i else 0.0) + (cr[j - 1] if j else 0.0) <= lim:
                return t, -1
            k = i
            while k < no:  # every event of queue 2s is an offload's end
                tk = to[k]
                last = k
                while last + 1 < no and to[last + 1] <= tk:
                    last += 1
                while j < nr and tr[j] <= tk:
                    j += 1
                if base + co[last] + (cr[j - 1] if j else 0.0) <= lim:  # tk > t + du: a wait
                    waited[op] = xfer_q[qo][k]
                    return tk - du, -1
                k = last + 1
            return t, -1  # no earlier offload makes it fit: the violation is reported

        def reload_start(q: int, op: int, t: float) -> tuple[float, int, int]:
            """Start of RELOAD ``op`` (queue ``q``, its lane free and itself ready at ``t``)
            under the memory wait: at ``t`` if its bytes fit beside the events of the ops
            listed before it (every compute op and earlier reload of its stage has had its
            event by then), else when the earliest OFFLOAD of its stage listed before it that
            makes them fit ends. Returns (start, -1, the OFFLOAD waited for or -1), or (t, an
            earlier offload not timed yet, -1)."""
            s = q // 2
            lim = cap[s]
            assert lim is not None
            qo = q - 1
            no, nr = xbefore[op], xbefore1[op]
            cr = xev_cum[q]
            base = cbefore[op] + mdelta[op] + (cr[nr - 1] if nr else 0.0)
            to, co = xev_t[qo], xev_cum[qo]
            if len(to) < no:
                i = bisect_right(to, t)
                if base + (co[i - 1] if i else 0.0) <= lim:
                    return t, -1, -1  # fits even if no untimed offload has freed yet
                return t, xfer_q[qo][len(to)], -1
            i = bisect_right(to, t, 0, no)
            if base + (co[i - 1] if i else 0.0) <= lim:
                return t, -1, -1
            k = i
            while k < no:
                tk = to[k]
                last = k
                while last + 1 < no and to[last + 1] <= tk:
                    last += 1
                if base + co[last] <= lim:
                    return tk, -1, xfer_q[qo][k]
                k = last + 1
            return t, -1, -1  # no earlier offload makes it fit: the violation is reported

        def run_private_channel(c: int, q: int) -> int:
            """A lane of one transfer queue: transfers in list order, no arbitration."""
            s = q // 2
            k0 = k = xfer_ptr[q]
            free = chan_free[c]
            for op, a, b, la, lb, du in islice(xfer_rows[q], k0, None):
                ea, eb = end[a], end[b]
                if ea < 0 or eb < 0:
                    wait_on(a if ea < 0 else b, -1 - c)
                    break
                t = ea + la
                if eb + lb > t:
                    t = eb + lb
                if free > t:
                    t = free
                if q & 1 and reload_waits[s]:
                    t, blocker, held = reload_start(q, op, t)
                    if blocker >= 0:
                        wait_on(blocker, -1 - c)
                        break
                    if held >= 0:
                        waited[op] = held
                start[op] = t
                free = t + du
                end[op] = free
                if cap[s] is not None:
                    record(op, q, t, free)
                k += 1
                if op in waiters:
                    wake(op)
            xfer_ptr[q] = k
            chan_free[c] = free
            return k - k0

        def scan(c: int) -> tuple[int, int, float, list[int], int]:
            """Of a shared lane's head transfers: the one that can start first (its queue, op,
            ready time; queue -1 if none), the ops the blocked ones wait on, and the OFFLOAD the
            chosen one waits for memory (-1: none). Queues are in stage order, so ties go to
            the lower stage."""
            best_s, best_op, best_t, best_held = -1, -1, 0.0, -1
            blocked: list[int] = []
            for s in chan_members[c]:
                k = xfer_ptr[s]
                rows = xfer_rows[s]
                if k >= len(rows):
                    continue
                op, a, b, la, lb, _du = rows[k]
                ea, eb = end[a], end[b]
                if ea < 0 or eb < 0:
                    blocked.append(a if ea < 0 else b)
                    continue
                t = ea + la
                if eb + lb > t:
                    t = eb + lb
                held = -1
                if s & 1 and reload_waits[s // 2]:
                    # a reload that must wait for memory can start only then
                    waits_until, blocker, held = reload_start(s, op, max(t, chan_free[c]))
                    if blocker >= 0:
                        blocked.append(blocker)
                        continue
                    if held >= 0:
                        t = waits_until
                if best_s < 0 or t < best_t:
                    best_s, best_op, best_t, best_held = s, op, t, held
            return best_s, best_op, best_t, blocked, best_held

        def run_channel(c: int, item: int, force: bool) -> int:
            members = chan_members[c]
            if len(members) == 1:
                return run_private_channel(c, members[0])
            started = 0
            while True:
                q, op, t, blocked, held = scan(c)
                # A blocked head of another stage might become ready before the ready ones:
                # wait for it unless forced (the whole simulation is stalled).
                if q < 0 or (blocked and not force):
                    for b in blocked:
                        wait_on(b, item)
                    return started
                force = False
                if chan_free[c] > t:
                    t = chan_free[c]
                if held >= 0:
                    waited[op] = held
                start[op] = t
                e = t + xfer_rows[q][xfer_ptr[q]][5]
                end[op] = e
                if cap[q // 2] is not None:
                    record(op, q, t, e)
                chan_free[c] = e
                xfer_ptr[q] += 1
                started += 1
                if op in waiters:
                    wake(op)

        while True:
            while work:
                item = work.pop()
                in_work.discard(item)
                if item < 0:
                    done += run_channel(-1 - item, item, False)
                    continue
                s = item
                k0 = k = comp_ptr[s]
                free = dev_free[s]
                if cap[s] is None:
                    for op, a, b, c, la, lb, du in islice(comp_rows[s], k0, None):
                        ea, eb, ec = end[a], end[b], end[c]
                        if ea < 0 or eb < 0 or ec < 0:
                            wait_on(a if ea < 0 else (b if eb < 0 else c), s)
                            break
                        t = ea + la
                        if eb + lb > t:
                            t = eb + lb
                        if ec > t:  # the third dependency (a reload) has no lag
                            t = ec
                        if free > t:
                            t = free
                        start[op] = t
                        free = t + du
                        end[op] = free
                        k += 1
                        if op in waiters:
                            wake(op)
                else:
                    level = comp_level[s]
                    for op, a, b, c, la, lb, du in islice(comp_rows[s], k0, None):
                        ea, eb, ec = end[a], end[b], end[c]
                        if ea < 0 or eb < 0 or ec < 0:
                            wait_on(a if ea < 0 else (b if eb < 0 else c), s)
                            break
                        t = ea + la
                        if eb + lb > t:
                            t = eb + lb
                        if ec > t:
                            t = ec
                        if free > t:
                            t = free
                        if waits_for_memory[op]:
                            comp_level[s] = level
                            t, blocker = memory_start(s, op, t, du)
                            if blocker >= 0:
                                wait_on(blocker, s)
                                break
                        start[op] = t
                        free = t + du
                        end[op] = free
                        level += mdelta[op]
                        k += 1
                        if op in waiters:
                            wake(op)
                    comp_level[s] = level
                done += k - k0
                comp_ptr[s] = k
                dev_free[s] = free
            if done >= n:
                break
            # Stalled: a shared lane may be holding a ready transfer back while it waits to
            # learn whether a blocked one would be ready earlier. Release the earliest one.
            best_c, best_t = None, 0.0
            for c in chan_members:
                s, _op, t, _, _ = scan(c)
                if s >= 0 and (best_c is None or t < best_t):
                    best_c, best_t = c, t
            if best_c is None:
                break
            done += run_channel(best_c, -1 - best_c, True)

        if done < n:
            comp_ql = [[r[0] for r in rows] for rows in comp_rows]
            self._report_deadlock(comp_ql, comp_ptr, xfer_q, xfer_ptr, end, first_blocker)
            return None
        return np.fromiter(start, float, n), np.fromiter(end, float, n)  # (drops the sentinel)

    def _name(self, op: int) -> str:
        s = int(self.stage[op])
        return f"stage {s} {self.actions[s][op - int(self.offset[s])]}"

    def _report_deadlock(
        self,
        comp_q: list[list[int]],
        comp_ptr: list[int],
        xfer_q: list[list[int]],
        xfer_ptr: list[int],
        end: list[float],
        first_blocker: Callable[[int], int],
    ) -> None:
        """Name the cycle of ops that wait on each other."""
        p = self.pb.num_stages
        head: dict[int, int] = {}
        for s in range(p):
            if comp_ptr[s] < len(comp_q[s]):
                head[s] = comp_q[s][comp_ptr[s]]
        heads = set(head.values())

        def waits_on(op: int) -> int:
            b = first_blocker(op)
            if b < 0:
                return -1
            s = int(self.stage[b])
            if b in heads:
                return b
            if self.is_compute[b]:
                return head.get(s, b)
            q = 2 * s + int(is_duplex(self.pb) and self.code[b] == 5)  # its transfer queue
            k = xfer_ptr[q]
            return xfer_q[q][k] if k < len(xfer_q[q]) else b

        for start_op in head.values():
            chain = [start_op]
            seen = {start_op: 0}
            cur = start_op
            while True:
                nxt = waits_on(cur)
                if nxt < 0:
                    break
                if nxt in seen:
                    cyc = [*chain[seen[nxt] :], nxt]
                    hops = []
                    for x, y in itertools.pairwise(cyc):
                        blk = first_blocker(x)
                        hop = f"{self._name(x)} waits for {self._name(blk)}"
                        if blk != y:
                            hop += f" (queued behind {self._name(y)})"
                        hops.append(hop)
                    self.violations.append(
                        Violation(
                            kind="deadlock",
                            stage=int(self.stage[nxt]),
                            message="deadlock: " + "; ".join(hops),
                        )
                    )
                    return
                seen[nxt] = len(chain)
                chain.append(nxt)
                cur = nxt
        stuck = ", ".join(self._name(o) for o in head.values())
        self.violations.append(
            Violation(kind="deadlock", message=f"deadlock: cannot progress at {stuck}")
        )

    # ---- memory ------------------------------------------------------------------------------

    def _memory(self, start: np.ndarray, end: np.ndarray) -> list[MemoryCurve]:
        pb = self.pb
        p = pb.num_stages
        m_f, m_b, m_w = pb.cost("m_f"), pb.cost("m_b"), pb.cost("m_w")
        ob = pb.cost("offload_bytes")
        zero = np.zeros_like(ob)
        # delta of activation memory and of host-held bytes per op code
        DM = np.stack([m_f, m_b, m_w, m_b + m_w, -ob, ob])
        DH = np.stack([zero, zero, zero, zero, ob, -ob])
        code, st, ch = self.code, self.stage, self.ch
        delta = DM[code, st, ch]
        host = DH[code, st, ch]
        times = np.where(code == 5, start, end)
        order = np.lexsort((times, st))
        st_o, t_o = st[order], times[order]
        curves = []
        bounds = np.searchsorted(st_o, np.arange(p + 1))
        for s in range(p):
            lo, hi = bounds[s], bounds[s + 1]
            t_s = t_o[lo:hi]
            level = np.cumsum(delta[order[lo:hi]])
            offl = np.cumsum(host[order[lo:hi]])
            k = hi - lo
            if k:
                scale = max(float(abs(t_s[-1])), 1e-30)
                last = np.ones(k, dtype=bool)
                last[:-1] = np.diff(t_s) > 1e-12 * scale
                t_s, level, offl = t_s[last], level[last], offl[last]
                t_s = np.concatenate(([min(0.0, float(t_s[0]))], t_s))
                level = np.concatenate(([0.0], level))
                offl = np.concatenate(([0.0], offl))
            curves.append(MemoryCurve(t_s, level, offl))
        return curves
