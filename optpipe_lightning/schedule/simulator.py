"""The one simulator: times a schedule exactly, checks it, and measures it.

Event-driven over integer op ids. Each stage runs its compute actions in list order, each as early
as its dependencies allow (an F needs the previous layer group's F, plus ``t_comm`` of the sending
stage when that group is on another device; a B needs its own F and the next group's B, plus comm;
a W needs its B; a B of an offloaded activation needs its RELOAD). Transfers run one at a time per
copy channel, in list order per stage, issued when the compute action listed before them ends;
on a channel shared by several stages the ready transfer that can start first goes first (ties:
lower stage).

Memory (per stage, activations only, starting at 0): F adds ``m_f`` when it ends, B adds ``m_b``
and W ``m_w`` when they end (a BW both), an OFFLOAD frees its bytes when it ends, a RELOAD
allocates them when it starts. Changes at the same instant net out before the limit is checked.

The same function is the validator: a schedule with missing or duplicate ops, an order that cannot
progress (deadlock), a reload after its B, an offload of an activation that is not there, or
memory above the limit at any instant is reported with every violation by name.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

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
    return _Simulator(problem, actions).run()


class ScheduleMismatchError(ValueError):
    """The schedule belongs to another problem."""


class _Simulator:
    def __init__(self, problem: Problem, actions: Sequence[Sequence[Action]]) -> None:
        self.pb = problem
        self.actions = [list(row) for row in actions]
        self.violations: list[Violation] = []

    # ---- structure ---------------------------------------------------------------------------

    def _index(self) -> bool:
        """Give every action an op id; check presence, uniqueness and pairing. False if broken."""
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
        # key = ((stage * v + chunk) * m + mb) * 6 + kind
        self.pos: dict[int, tuple[int, int]] = {}
        for s, row in enumerate(self.actions):
            for i, a in enumerate(row):
                code = _KIND_CODE.get(a.op)
                if code is None or not (0 <= a.mb < m) or not (0 <= a.chunk < v):
                    viol.append(
                        Violation(
                            kind="unknown-op",
                            stage=s,
                            message=f"stage {s} action {i} {a}: no such op "
                            f"(microbatches 0..{m - 1}, chunks 0..{v - 1})",
                        )
                    )
                    continue
                key = ((s * v + a.chunk) * m + a.mb) * 6 + code
                if key in self.pos:
                    viol.append(
                        Violation(
                            kind="duplicate-op", stage=s, message=f"stage {s} runs {a} twice"
                        )
                    )
                    continue
                self.pos[key] = (s, i)
        pos = self.pos
        for s in range(p):
            for c in range(v):
                for mb in range(m):
                    base = ((s * v + c) * m + mb) * 6
                    has = [base + k in pos for k in range(6)]
                    name = f"(mb {mb}" + (f", chunk {c})" if v > 1 else ")")
                    if not has[0]:
                        viol.append(
                            Violation(kind="missing-op", stage=s, message=f"stage {s} has no F {name}")
                        )
                    if has[3] and (has[1] or has[2]):
                        viol.append(
                            Violation(
                                kind="duplicate-op",
                                stage=s,
                                message=f"stage {s} has BW and also B or W {name}",
                            )
                        )
                    elif not has[3] and not (has[1] and has[2]):
                        missing = "B and W (or BW)" if not (has[1] or has[2]) else (
                            "W" if has[1] else "B"
                        )
                        viol.append(
                            Violation(
                                kind="missing-op",
                                stage=s,
                                message=f"stage {s} has no {missing} {name}",
                            )
                        )
                    if has[4] or has[5]:
                        if pb.offload is None:
                            viol.append(
                                Violation(
                                    kind="offload-not-allowed",
                                    stage=s,
                                    message=f"stage {s} moves {name} but the problem has "
                                    "offload: null",
                                )
                            )
                        elif has[4] != has[5]:
                            viol.append(
                                Violation(
                                    kind="offload-unpaired",
                                    stage=s,
                                    message=f"stage {s} has "
                                    + ("OFFLOAD without RELOAD " if has[4] else "RELOAD without OFFLOAD ")
                                    + name,
                                )
                            )
                        else:
                            i_f = pos.get(base)
                            i_o = pos[base + 4]
                            i_r = pos[base + 5]
                            back = pos.get(base + 1) or pos.get(base + 3)
                            if i_f is not None and i_o[1] < i_f[1]:
                                viol.append(
                                    Violation(
                                        kind="offload-not-there",
                                        stage=s,
                                        message=f"stage {s} offloads {name} before its F",
                                    )
                                )
                            if i_r[1] < i_o[1]:
                                viol.append(
                                    Violation(
                                        kind="offload-not-there",
                                        stage=s,
                                        message=f"stage {s} reloads {name} before offloading it",
                                    )
                                )
                            if back is not None and i_r[1] > back[1]:
                                viol.append(
                                    Violation(
                                        kind="reload-after-use",
                                        stage=s,
                                        message=f"stage {s} reloads {name} after its backward",
                                    )
                                )
        return not viol

    # ---- timing ------------------------------------------------------------------------------

    def run(self) -> SimResult:
        pb = self.pb
        p = pb.num_stages
        limits = pb.memory_limits()
        if not self._index():
            return SimResult(
                Evaluation(
                    feasible=False,
                    makespan=None,
                    memory_limit=limits,
                    num_offloaded=sum(1 for r in self.actions for a in r if a.op == "OFFLOAD"),
                    violations=self.violations,
                )
            )
        timed = self._time()
        if timed is None:
            return SimResult(
                Evaluation(
                    feasible=False,
                    makespan=None,
                    memory_limit=limits,
                    num_offloaded=sum(1 for r in self.actions for a in r if a.op == "OFFLOAD"),
                    violations=self.violations,
                )
            )
        starts, ends = timed
        timeline = Timeline(self.actions, starts, ends)
        # metrics
        t0 = min((float(st.min()) for st in starts if st.size), default=0.0)
        t1 = max((float(en.max()) for en in ends if en.size), default=0.0)
        makespan = t1 - t0
        work = np.zeros(p)
        spans = np.zeros(p)
        for s in range(p):
            row = self.actions[s]
            is_c = np.fromiter((a.op in COMPUTE_KINDS for a in row), dtype=bool, count=len(row))
            if not is_c.any():
                continue
            st, en = starts[s][is_c], ends[s][is_c]
            work[s] = float((en - st).sum())
            is_f = np.fromiter((a.op == "F" for a in row), dtype=bool, count=len(row))
            first_f = float(starts[s][is_f].min()) if is_f.any() else float(st.min())
            spans[s] = float(en.max()) - first_f
        bubble = 1.0 - float(work.sum()) / (p * makespan) if makespan > 0 else 0.0
        s_max = int(np.argmax(spans))
        span = float(spans[s_max])
        span_rate = (span - float(work[s_max])) / span if span > 0 else 0.0
        curves = self._memory(starts, ends)
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
            num_offloaded=sum(1 for r in self.actions for a in r if a.op == "OFFLOAD"),
            violations=self.violations,
        )
        return SimResult(ev, timeline, curves)

    def _time(self) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
        """ASAP times of every action; None (with a deadlock violation) if the order is stuck."""
        pb = self.pb
        p, m, v = pb.num_stages, pb.num_microbatches, pb.num_chunks
        G = p * v
        t_f, t_b, t_w = pb.cost("t_f"), pb.cost("t_b"), pb.cost("t_w")
        t_comm = pb.cost("t_comm")
        table = pb.group_table
        grp = [[pb.group_of(s, c) for c in range(v)] for s in range(p)]
        pos = self.pos
        acts = self.actions
        n_total = sum(len(r) for r in acts)
        # Flat op ids: stage offset + index in row.
        offset = [0] * (p + 1)
        for s in range(p):
            offset[s + 1] = offset[s] + len(acts[s])
        end = [-1.0] * n_total
        start = [0.0] * n_total
        dur = [0.0] * n_total
        # deps[i] = list of (op id, lag)
        deps: list[tuple[tuple[int, float], ...]] = [()] * n_total
        issue_of = [-1] * n_total  # transfers: op id of the compute action listed before
        is_transfer = [False] * n_total
        channel = pb.channel_of()
        stage_of_op = [s for s in range(p) for _ in range(len(acts[s]))]

        def oid(key: int) -> int:
            s, i = pos[key]
            return offset[s] + i

        for s in range(p):
            last_compute = -1
            for i, a in enumerate(acts[s]):
                me = offset[s] + i
                c, mb = a.chunk, a.mb
                base = ((s * v + c) * m + mb) * 6
                g = grp[s][c]
                op = a.op
                if op == "F":
                    dur[me] = float(t_f[s, c])
                    if g > 0:
                        ps, pc = table[g - 1]
                        lag = float(t_comm[ps, pc]) if ps != s else 0.0
                        deps[me] = ((oid(((ps * v + pc) * m + mb) * 6), lag),)
                elif op in ("B", "BW"):
                    dur[me] = float(t_b[s, c]) + (float(t_w[s, c]) if op == "BW" else 0.0)
                    d: list[tuple[int, float]] = [(oid(base), 0.0)]
                    if g < G - 1:
                        ns, nc = table[g + 1]
                        nbase = ((ns * v + nc) * m + mb) * 6
                        nk = nbase + 1 if nbase + 1 in pos else nbase + 3
                        lag = float(t_comm[ns, nc]) if ns != s else 0.0
                        d.append((oid(nk), lag))
                    if base + 5 in pos:
                        d.append((oid(base + 5), 0.0))
                    deps[me] = tuple(d)
                elif op == "W":
                    dur[me] = float(t_w[s, c])
                    deps[me] = ((oid(base + 1), 0.0),)
                elif op == "OFFLOAD":
                    dur[me] = pb.offload_time(s, c)
                    deps[me] = ((oid(base), 0.0),)
                    is_transfer[me] = True
                    issue_of[me] = last_compute
                else:  # RELOAD
                    dur[me] = pb.reload_time(s, c)
                    deps[me] = ((oid(base + 4), 0.0),)
                    is_transfer[me] = True
                    issue_of[me] = last_compute
                if op in COMPUTE_KINDS:
                    last_compute = me

        # Per stage: queue of compute ops and of transfer ops, in list order.
        comp_q = [
            [offset[s] + i for i, a in enumerate(acts[s]) if a.op in COMPUTE_KINDS] for s in range(p)
        ]
        xfer_q = [
            [offset[s] + i for i, a in enumerate(acts[s]) if a.op not in COMPUTE_KINDS]
            for s in range(p)
        ]
        comp_ptr = [0] * p
        xfer_ptr = [0] * p
        dev_free = [0.0] * p
        chan_members: dict[int, list[int]] = {}
        for s in range(p):
            chan_members.setdefault(channel[s], []).append(s)
        chan_free = dict.fromkeys(chan_members, 0.0)
        waiters: list[list[int] | None] = [None] * n_total  # op -> work items waiting on it
        # work items: s (>= 0) = compute queue of stage s; -1 - ch = channel ch
        work: list[int] = list(range(p)) + [-1 - ch for ch in chan_members]
        in_work = set(work)
        done = 0

        def blocker(op: int) -> int:
            """-1 if every dependency of op has ended, else the first one that has not."""
            for dop, _lag in deps[op]:
                if end[dop] < 0:
                    return dop
            if is_transfer[op]:
                iss = issue_of[op]
                if iss >= 0 and end[iss] < 0:
                    return iss
            return -1

        def ready_time(op: int) -> float:
            t = 0.0
            for dop, lag in deps[op]:
                x = end[dop] + lag
                if x > t:
                    t = x
            if is_transfer[op]:
                iss = issue_of[op]
                if iss >= 0 and end[iss] > t:
                    t = end[iss]
            return t

        def finish(op: int) -> None:
            w = waiters[op]
            if w:
                for item in w:
                    if item not in in_work:
                        in_work.add(item)
                        work.append(item)
                waiters[op] = None

        def heads(ch: int) -> tuple[list[tuple[int, float]], list[tuple[int, int]]]:
            """Ready (op, ready time) and blocked (op, blocker) head transfers of a channel."""
            ready: list[tuple[int, float]] = []
            blocked: list[tuple[int, int]] = []
            for s in chan_members[ch]:
                k = xfer_ptr[s]
                if k < len(xfer_q[s]):
                    op = xfer_q[s][k]
                    b = blocker(op)
                    if b >= 0:
                        blocked.append((op, b))
                    else:
                        ready.append((op, ready_time(op)))
            return ready, blocked

        def channel_candidate(ch: int) -> float | None:
            ready, _ = heads(ch)
            return min(t for _, t in ready) if ready else None

        def run_channel(ch: int, item: int, force: bool) -> int:
            """Start transfers on a channel while its order is known; the number started."""
            started = 0
            while True:
                ready, blocked = heads(ch)
                # A blocked head of another stage might become ready before the ready ones:
                # wait for it unless forced (the whole simulation is stalled).
                if not ready or (blocked and not force):
                    for _op, b in blocked:
                        lst = waiters[b]
                        if lst is None:
                            waiters[b] = [item]
                        elif item not in lst:
                            lst.append(item)
                    return started
                force = False
                op, t = min(ready, key=lambda x: (x[1], x[0]))
                t = max(t, chan_free[ch])
                start[op] = t
                end[op] = t + dur[op]
                chan_free[ch] = end[op]
                xfer_ptr[stage_of_op[op]] += 1
                started += 1
                finish(op)

        while work:
            item = work.pop()
            in_work.discard(item)
            if item >= 0:
                s = item
                q = comp_q[s]
                k = comp_ptr[s]
                free = dev_free[s]
                while k < len(q):
                    op = q[k]
                    b = blocker(op)
                    if b >= 0:
                        lst = waiters[b]
                        if lst is None:
                            waiters[b] = [s]
                        elif s not in lst:
                            lst.append(s)
                        break
                    t = ready_time(op)
                    if free > t:
                        t = free
                    start[op] = t
                    free = t + dur[op]
                    end[op] = free
                    done += 1
                    k += 1
                    finish(op)
                comp_ptr[s] = k
                dev_free[s] = free
            else:
                done += run_channel(-1 - item, item, False)

            if not work and done < n_total:
                # Stalled: a shared channel may be holding a ready transfer back while it waits to
                # learn whether a blocked one would be ready earlier. Release the earliest.
                best_ch, best_t = None, 0.0
                for ch in chan_members:
                    t = channel_candidate(ch)
                    if t is not None and (best_ch is None or t < best_t):
                        best_ch, best_t = ch, t
                if best_ch is not None:
                    done += run_channel(best_ch, -1 - best_ch, True)

        if done < n_total:
            self._report_deadlock(offset, comp_q, comp_ptr, xfer_q, xfer_ptr, end, deps, issue_of)
            return None
        starts = [np.asarray(start[offset[s] : offset[s + 1]]) for s in range(p)]
        ends = [np.asarray(end[offset[s] : offset[s + 1]]) for s in range(p)]
        return starts, ends

    @staticmethod
    def _stage_of(op: int, offset: list[int]) -> int:
        lo, hi = 0, len(offset) - 2
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if offset[mid] <= op:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _report_deadlock(self, offset, comp_q, comp_ptr, xfer_q, xfer_ptr, end, deps, issue_of) -> None:  # type: ignore[no-untyped-def]
        p = self.pb.num_stages

        def name(op: int) -> str:
            s = self._stage_of(op, offset)
            return f"stage {s} {self.actions[s][op - offset[s]]}"

        # wait-for edges from each blocked head op to the head op of the stage holding its blocker
        head: dict[int, int] = {}
        for s in range(p):
            if comp_ptr[s] < len(comp_q[s]):
                head[s] = comp_q[s][comp_ptr[s]]

        def first_blocker(op: int) -> int:
            for dop, _ in deps[op]:
                if end[dop] < 0:
                    return dop
            iss = issue_of[op]
            return iss if iss >= 0 and end[iss] < 0 else -1

        def waits_on(op: int) -> int:
            b = first_blocker(op)
            if b < 0:
                return -1
            s = self._stage_of(b, offset)
            # b is a compute op behind the head of stage s, or a transfer behind its channel
            if b in head.values():
                return b
            if self.actions[s][b - offset[s]].op in COMPUTE_KINDS:
                return head.get(s, b)
            k = xfer_ptr[s]
            return xfer_q[s][k] if k < len(xfer_q[s]) else b

        reported = False
        for start_op in list(head.values()):
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
                        hop = f"{name(x)} waits for {name(blk)}"
                        if blk != y:
                            hop += f" (queued behind {name(y)})"
                        hops.append(hop)
                    self.violations.append(
                        Violation(
                            kind="deadlock",
                            stage=self._stage_of(nxt, offset),
                            message="deadlock: " + "; ".join(hops),
                        )
                    )
                    reported = True
                    break
                seen[nxt] = len(chain)
                chain.append(nxt)
                cur = nxt
            if reported:
                break
        if not reported:
            stuck = ", ".join(name(o) for o in head.values())
            self.violations.append(
                Violation(kind="deadlock", message=f"deadlock: cannot progress at {stuck}")
            )

    # ---- memory ------------------------------------------------------------------------------

    def _memory(self, starts: list[np.ndarray], ends: list[np.ndarray]) -> list[MemoryCurve]:
        pb = self.pb
        m_f, m_b, m_w = pb.cost("m_f"), pb.cost("m_b"), pb.cost("m_w")
        ob = pb.cost("offload_bytes")
        curves = []
        for s, row in enumerate(self.actions):
            n = len(row)
            times = np.empty(n)
            delta = np.empty(n)
            host = np.zeros(n)
            st, en = starts[s], ends[s]
            for i, a in enumerate(row):
                c = a.chunk
                op = a.op
                if op == "F":
                    times[i], delta[i] = en[i], m_f[s, c]
                elif op == "B":
                    times[i], delta[i] = en[i], m_b[s, c]
                elif op == "W":
                    times[i], delta[i] = en[i], m_w[s, c]
                elif op == "BW":
                    times[i], delta[i] = en[i], m_b[s, c] + m_w[s, c]
                elif op == "OFFLOAD":
                    times[i], delta[i] = en[i], -ob[s, c]
                    host[i] = ob[s, c]
                else:
                    times[i], delta[i] = st[i], ob[s, c]
                    host[i] = -ob[s, c]
            order = np.argsort(times, kind="stable")
            t_sorted = times[order]
            level = np.cumsum(delta[order])
            off = np.cumsum(host[order])
            if n:
                scale = max(float(abs(t_sorted[-1])), 1e-30)
                last = np.ones(n, dtype=bool)
                last[:-1] = np.diff(t_sorted) > 1e-12 * scale
                t_sorted, level, off = t_sorted[last], level[last], off[last]
                t_sorted = np.concatenate(([min(0.0, float(t_sorted[0]))], t_sorted))
                level = np.concatenate(([0.0], level))
                off = np.concatenate(([0.0], off))
            curves.append(MemoryCurve(t_sorted, level, off))
        return curves
