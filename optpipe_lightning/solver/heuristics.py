"""Offload-aware list schedulers: a valid first schedule at once, and the solver's hint.

One event-driven greedy, several rules. Each device runs, whenever it is free, the ready op of
highest priority: B > F > W (an F only when its activation fits the memory limit at the moment
it finishes, and only while the stage has fewer than ``inflight`` microbatches in flight). Every
transfer is issued the way the simulator issues it (after the compute op listed before it), so
the simulator reproduces the greedy's timing; the simulator still judges every result.

The simulator runs each op as soon as its list position and dependencies allow; the one wait it
knows is the memory wait (an F that would not fit ends when an earlier offload of its stage that
makes it fit ends). So a forward that is ready but does not fit either waits that way (rules with
``wait``, only when no B or W is ready to fill the time) or is put after the next op that becomes
ready later (the device idles until then).

Offload rules: ``"none"`` (memory-aware, no transfers), ``"all"`` (offload every activation except
on the last virtual stage, which runs its B right after its F), ``"lazy"`` (offload only when the
next forward would not fit otherwise). A reload starts when the B of the same microbatch
``reload_lead`` virtual stages downstream starts (1 = the upstream B that feeds it), on the
stage's copy channel with reloads ahead of offloads, as soon as memory allows.

``"plan"`` (one chunk per stage) plans each copy on the channel's timeline instead, for copies
about as slow as the compute or slower, where offloading every activation saturates the channel
(each offloaded activation keeps it busy for an offload and a reload). A forward's activation is
offloaded only if the channel is free when the forward ends and the copy crosses no planned
copy, and if the reload fits: triggered by the start of a deeper group's B of the same
microbatch (the nearest whose backward chain hides the reload plus ``margin`` offload times, or
a nearer one whose B then waits a little), it must cross no planned copy and fit beside what
the stage will hold (reservations of the planned reloads, and the activations it holds freed at
the earliest their B and W can end). Forwards, offloaded or not, are admitted only if those
reservations still fit. ``eager`` offloads whenever a copy can be planned; otherwise only when
the forward would not fit as resident. Measured (``bench_list_rules.py``): 32x256x1 at a
quarter of the memory, copies 2x, 2131 -> 1923; at half, copies 1x, 1099 -> 1033.

Memory-fitted rules (``fit``, several chunks per stage): each group's in-flight cap is 1F1B's
depth ``G - g`` scaled down, per stage, until the stage's groups' in-flight activations at those
caps fit its limit. With ``reserve`` a forward also leaves room for one activation of each deeper
group of its stage that is behind it, so the shallow chunk cannot fill the memory that the deep
chunk's forward (which every backward waits for) needs: without it V-shape orders deadlock at a
quarter of the memory. Where copies are slower than compute these no-offload rules beat the
offload rules by 2-4x (8x32x2 at a quarter of the memory, copies 2x: 187 against 640).
"""

from __future__ import annotations

import gc
import heapq
import itertools
from bisect import bisect_right, insort
from dataclasses import dataclass

from ..schedule.lanes import is_duplex, stage_lanes
from ..schedule.problem import Problem
from ..schedule.schedule import Action, Schedule
from ..schedule.simulator import evaluate

_EPS = 1e-12


@dataclass(frozen=True)
class ListRule:
    name: str
    offload: str = "all"  # "none" | "all" | "lazy" | "plan"
    inflight: float | None = 1.0  # factor on the 1F1B depth (G - group); None = unlimited
    deep_first: bool = True  # among ready F's, the deeper virtual stage first
    reload_lead: int = 1
    wait: bool = False  # a forward that does not fit may wait for an offload to free memory
    headroom: int = 1  # "lazy": offload when fewer than this many more forwards would fit
    fit: bool = False  # scale each stage's depths so that its in-flight activations fit its limit
    reserve: bool = False  # an F leaves room for one activation of each deeper group of its stage
    margin: float = 1.0  # "plan": a reload starts this many offload times early, besides its own
    eager: bool = False  # "plan": offload whenever the channel plan allows, not only when needed
    # "all" / "lazy": offload a group's activations only where the time from its F's end to its
    # B's start is at least this many times its offload plus reload (0: wherever possible)
    trip_room: float = 0.0


def default_rules(problem: Problem) -> list[ListRule]:
    """The rules worth trying on this problem, in the order they run.

    Under a memory limit that a no-offload order fits, the cheapest rule comes first: a
    memory-fitted one without transfers (an answer at once: no copies to simulate). Where copies
    take longer than the compute they would hide behind, every no-offload rule comes before
    the offload rules (those mostly get stuck there, after a full run).
    """
    limited = any(x is not None for x in problem.memory_limits())
    offload: list[ListRule] = []
    if problem.offload is not None and limited:
        offload = [
            ListRule("offload-all-lead2", "all", 1.0, reload_lead=2),
            ListRule("offload-all", "all", 1.0),
            ListRule("offload-lazy", "lazy", 1.0),
            ListRule("offload-all-wide", "all", 2.0),
            ListRule("offload-lazy-wide", "lazy", 2.0, reload_lead=2),
            ListRule("offload-all-mbfirst", "all", 1.0, deep_first=False),
            ListRule("offload-all-lead2-wait", "all", 1.0, reload_lead=2, wait=True),
            ListRule("offload-all-wait", "all", 1.0, wait=True),
            ListRule("offload-lazy-wait", "lazy", 1.0, wait=True),
            ListRule("offload-all-wide-wait", "all", 2.0, wait=True),
            ListRule("offload-lazy-wait-lead3", "lazy", 1.5, reload_lead=3, wait=True),
            ListRule("offload-lazy-wait-wide-lead3", "lazy", 2.0, reload_lead=3, wait=True),
            ListRule("offload-lazy-wait-room2", "lazy", 1.0, reload_lead=2, wait=True, headroom=2),
            # offload only where the copies fit in the round trip up the pipeline and back: the
            # last stages then run one microbatch at a time instead of waiting on their reloads
            # (4x8x1 at half the memory, copies 0.5x: 34.5 -> 29.5, against an optimum of 29)
            ListRule("offload-all-wait-trip1", "all", 1.0, wait=True, trip_room=1.0),
            ListRule(
                "offload-lazy-wait-lead2-trip1",
                "lazy",
                1.5,
                reload_lead=2,
                wait=True,
                trip_room=1.0,
            ),
        ]
        if problem.num_chunks == 1:
            # copies planned on the channel's timeline: the rules that pay where copies are
            # about as slow as the compute or slower (the others saturate the channel there)
            plan = [
                ListRule("offload-plan", "plan", None, margin=0.5, eager=True),
                ListRule("offload-plan-tight", "plan", None, margin=0.25, eager=True),
            ]
            offload = plan + offload if slow_copies(problem) else offload + plan
    plain = [
        ListRule("greedy", "none", None),
        ListRule("greedy-1f1b", "none", 1.0),
        ListRule("greedy-mbfirst", "none", None, deep_first=False),
    ]
    if not limited:
        return offload + plain
    plain.append(ListRule("greedy-2x", "none", 2.0))
    fitted: list[ListRule] = []
    if problem.num_chunks > 1:
        # 1F1B's depths scaled to the limit: with several chunks per stage the plain rules fill
        # the memory with shallow chunks' activations and starve (or deadlock) the deep ones
        fitted = [
            ListRule("fit-reserve", "none", 0.8, fit=True, reserve=True),
            ListRule("fit", "none", 0.75, fit=True),
            ListRule("fit-deep", "none", 0.9, fit=True),
        ]
    if not offload or not no_offload_fits(problem):
        return offload + fitted + plain
    cheap = fitted[:1] if fitted else [plain[1]]
    rest = [r for r in fitted + plain if r not in cheap]
    if slow_copies(problem):
        return cheap + rest + offload
    return cheap + offload + rest


def no_offload_fits(problem: Problem) -> bool:
    """Whether one microbatch at a time without offload fits every stage's limit (so the
    no-offload rules can finish)."""
    limits = problem.memory_limits()
    m_f, m_b, m_w = (problem.cost(n) for n in ("m_f", "m_b", "m_w"))
    for s, lim in enumerate(limits):
        if lim is None:
            continue
        order = sorted(range(problem.num_chunks), key=lambda c: problem.group_of(s, c))
        level = peak = 0.0
        for c in order:
            level += float(m_f[s, c])
            peak = max(peak, level)
        for c in reversed(order):
            level += float(m_b[s, c])
            peak = max(peak, level)
            level += float(m_w[s, c])
        if peak > lim * (1 + 1e-9) + 1e-6:
            return False
    return True


def slow_copies(problem: Problem, ratio: float = 1.0, strict: bool = True) -> bool:
    """Whether most offloadable activations take longer to copy out than ``ratio`` times their
    microbatch's compute on that chunk (F + B + W; at least that long unless ``strict``)."""
    if problem.offload is None:
        return False
    t = problem.cost("t_f") + problem.cost("t_b") + problem.cost("t_w")
    ob = problem.cost("offload_bytes")
    slow = total = 0
    for s in range(problem.num_stages):
        for c in range(problem.num_chunks):
            if ob[s, c] > 0:
                total += 1
                copy, compute = problem.offload_time(s, c), ratio * float(t[s, c])
                slow += copy > compute if strict else copy >= compute * (1 - 1e-9)
    return total > 0 and 2 * slow > total


class _Memory:
    """One stage's activation memory: settled level plus future (time, delta) events."""

    __slots__ = ("base", "events", "limit")

    def __init__(self, limit: float | None) -> None:
        self.limit = limit
        self.base = 0.0
        self.events: list[tuple[float, float]] = []

    def add(self, t: float, d: float) -> None:
        if d:
            insort(self.events, (t, d))

    def settle(self, t: float) -> None:
        ev = self.events
        k = 0
        while k < len(ev) and ev[k][0] < t - _EPS:
            self.base += ev[k][1]
            k += 1
        if k:
            del ev[:k]

    def wait_until(self, t: float, d: float) -> float | None:
        """The simulator's memory wait for ``d`` bytes that do not fit at ``t``: the first
        later freeing event after which the level fits, if the level fits from there on."""
        if self.limit is None:
            return None
        lim = self.limit * (1 + 1e-9) + 1e-6
        level = self.base + d
        ev = self.events
        i, n = 0, len(ev)
        while i < n and ev[i][0] <= t + _EPS:
            level += ev[i][1]
            i += 1
        while i < n:
            t0 = ev[i][0]
            freeing = False
            while i < n and ev[i][0] <= t0 + _EPS:
                freeing = freeing or ev[i][1] < 0
                level += ev[i][1]
                i += 1
            if freeing and level <= lim:
                return t0 if self.fits(t0, d) else None
        return None

    def level_at(self, t: float) -> float:
        """The level just after the events at ``t``."""
        level = self.base
        for te, d in self.events:
            if te > t + _EPS:
                break
            level += d
        return level

    def remove(self, t: float, d: float) -> None:
        """Take back an event added earlier (from the settled level if it is already there)."""
        try:
            self.events.remove((t, d))
        except ValueError:
            self.base -= d

    def fits_many(
        self,
        changes: list[tuple[float, float]],
        extra: list[tuple[float, float]] = (),  # type: ignore[assignment]
    ) -> bool:
        """Whether adding every (time, delta) of ``changes`` keeps each later level within the
        limit (each instant's events net out before the check)."""
        if self.limit is None:
            return True
        lim = self.limit * (1 + 1e-9) + 1e-6
        t_min = min(t for t, _ in changes)
        merged = sorted(self.events + changes + list(extra))
        level = self.base
        i, n = 0, len(merged)
        while i < n:
            t0 = merged[i][0]
            while i < n and merged[i][0] <= t0 + _EPS:
                level += merged[i][1]
                i += 1
            if t0 >= t_min - _EPS and level > lim:
                return False
        return True

    def fits(self, t: float, d: float) -> bool:
        """Whether adding ``d`` at time ``t`` keeps every later level within the limit."""
        if self.limit is None:
            return True
        lim = self.limit * (1 + 1e-9) + 1e-6
        level = self.base
        ev = self.events
        i = 0
        n = len(ev)
        while i < n and ev[i][0] <= t + _EPS:
            level += ev[i][1]
            i += 1
        level += d
        while i < n:
            # all events of one instant net out before the check
            t0 = ev[i][0]
            if level > lim:
                return False
            while i < n and ev[i][0] <= t0 + _EPS:
                level += ev[i][1]
                i += 1
        return level <= lim


def list_schedule(problem: Problem, rule: ListRule) -> list[list[Action]] | None:
    """Action lists built by the greedy under ``rule``; None if it got stuck."""
    gc_was_enabled = gc.isenabled()
    # the greedy allocates many small, short-lived objects and makes no reference cycles: the
    # collector's passes over the large live tables cost 10-25% at 32 x 256 x 2
    gc.disable()
    try:
        return _list_schedule(problem, rule)
    finally:
        if gc_was_enabled:
            gc.enable()


def _list_schedule(problem: Problem, rule: ListRule) -> list[list[Action]] | None:
    pb = problem
    p, v, m = pb.num_stages, pb.num_chunks, pb.num_microbatches
    G = p * v
    table = pb.group_table
    # plain nested lists: the greedy indexes them per op (numpy scalar indexing is slow)
    t_f, t_b, t_w, comm, m_f, m_b, m_w, ob = (
        pb.cost(name).tolist()
        for name in ("t_f", "t_b", "t_w", "t_comm", "m_f", "m_b", "m_w", "offload_bytes")
    )
    t_off = [[pb.offload_time(s, c) for c in range(v)] for s in range(p)]
    t_rel = [[pb.reload_time(s, c) for c in range(v)] for s in range(p)]
    limits = pb.memory_limits()
    # copy lanes (``schedule.lanes``): per stage (offload lane, reload lane), the same one on
    # one lane for both directions
    lanes = stage_lanes(pb)
    duplex = is_duplex(pb)
    mem = [_Memory(limits[s]) for s in range(p)]
    off_on = pb.offload is not None and rule.offload != "none"
    members: dict[int, list[int]] = {}  # lane -> the stages on it
    for s in range(p):
        for lane in dict.fromkeys(lanes[s]):
            members.setdefault(lane, []).append(s)

    rows: list[list[Action]] = [[] for _ in range(p)]
    last_end = [0.0] * p  # end of the last compute op listed on each stage
    last_op: list[tuple[str, int, int] | None] = [None] * p  # (op, group, mb)
    dev_free = [0.0] * p
    lane_free = dict.fromkeys(members, 0.0)
    f_end = [[-1.0] * m for _ in range(G)]
    b_start = [[-1.0] * m for _ in range(G)]
    b_end = [[-1.0] * m for _ in range(G)]
    off_end = [[-1.0] * m for _ in range(G)]
    rel_end = [[-1.0] * m for _ in range(G)]
    offloaded = [[False] * m for _ in range(G)]
    nf = [0] * G  # next mb for F / B / W of each group (microbatch order)
    nb = [0] * G
    nw = [0] * G
    groups_of = [[pb.group_of(s, c) for c in range(v)] for s in range(p)]
    pending_reloads: list[list[tuple[int, int]]] = [[] for _ in range(p)]  # (group, mb)
    depth = [float(G - g) for g in range(G)]
    if rule.fit:
        depth = _fitted_depths(pb, groups_of, limits, m_f)
    cap = [None if rule.inflight is None else max(1.0, rule.inflight * depth[g]) for g in range(G)]
    lag_in = [0.0] * G  # comm lag into group g from g-1 (forward) ...
    lag_back = [0.0] * G  # ... and into group g from g+1 (backward)
    for g in range(G):
        s, _c = table[g]
        if g > 0:
            ps, pc = table[g - 1]
            lag_in[g] = float(comm[ps][pc]) if ps != s else 0.0
        if g < G - 1:
            ns, nc = table[g + 1]
            lag_back[g] = float(comm[ns][nc]) if ns != s else 0.0

    # "plan" (see ``plan_offload``): per group the B whose start triggers its reloads at the
    # earliest (-1: never offloaded), and the least times along the chains that place them
    plan_on = off_on and rule.offload == "plan"
    trig_group = [-1] * G
    f_top = b_from_top = b_end_after = [0.0] * G
    if off_on:
        f_top, b_from_top, b_end_after = _chains(pb, lag_in, lag_back)
    if plan_on:
        trig_group = _plan_triggers(pb, rule, f_top, b_from_top, t_off, t_rel)
    # groups whose activations the "all" / "lazy" rules may offload
    roomy = [
        f_top[g] + b_from_top[g] >= rule.trip_room * (t_off[s][c] + t_rel[s][c]) - _EPS
        for g, (s, c) in enumerate(table)
    ]
    stage_off_ends: list[list[float]] = [[] for _ in range(p)]  # each stage's offload ends
    trig_wait: dict[tuple[int, int], list[int]] = {}  # (trigger group, mb) -> groups to reload
    reservation = [[-1.0] * m for _ in range(G)]  # from when a planned reload's memory counts
    reserved: list[list[tuple[float, float]]] = [[] for _ in range(p)]  # ... per stage
    # planned copies not yet issued, per lane: ("O" | "R", group, mb) -> (start, end)
    lane_plan: dict[int, dict[tuple[str, int, int], tuple[float, float]]] = {
        lane: {} for lane in members
    }

    def forecast(s: int, now: float) -> list[tuple[float, float]]:
        """The frees of the activations stage s holds or will reload, at the earliest their
        B and W can end from ``now`` (B's in microbatch order, a B after its reload)."""
        out: list[tuple[float, float]] = []
        for g in groups_of[s]:
            c = table[g][1]
            tb, tw = float(t_b[s][c]), float(t_w[s][c])
            mb_, mw_ = float(m_b[s][c]), float(m_w[s][c])
            for j in range(nw[g], nb[g]):  # B done, W to come
                out.append((max(b_end[g][j], now) + tw, mw_))
            prev = now
            for j in range(nb[g], nf[g]):
                e = max(f_end[g][j] + b_end_after[g], prev + tb, now + tb)
                if offloaded[g][j]:
                    r = rel_end[g][j]
                    e = max(e, (r if r >= 0 else now + t_rel[s][c]) + tb)
                out.append((e, mb_))
                out.append((e + tw, mw_))
                prev = e
        return out

    def plan_offload(
        s: int, g: int, fe: float, need: float, now: float
    ) -> tuple[float, float, int] | None:
        """(offload end, reload start, trigger group) if the activation of the F of group g
        that ends at ``fe`` can be offloaded: the channel is free then and the copy crosses no
        planned copy; the memory holds ``need`` until the copy ends; and a reload, triggered by
        the start of a deeper group's B of the same microbatch, crosses no planned copy and fits
        beside what the stage holds then (reservations of planned reloads, and the activations
        it holds freed at the earliest their B and W can end). The nearest trigger whose chain
        still hides the reload (``rule.margin``) is tried first, then shallower ones (the B
        then waits for the reload)."""
        c = table[g][1]
        lane_o, lane_r = lanes[s]
        # on one lane the stage's pending reloads go first; with duplex they use the other lane
        if lane_free[lane_o] > fe + _EPS or (pending_reloads[s] and not duplex):
            return None
        oe = fe + t_off[s][c]
        plan = lane_plan[lane_o]
        for key, (a, b) in list(plan.items()):
            if b < fe - _EPS and key[0] == "O":
                del plan[key]
                continue
            if a < oe - _EPS and fe < b - _EPS:
                return None
        plan = lane_plan[lane_r]
        bb = float(ob[s][c])
        # now: the copy must free the memory before anything else needs it
        if not mem[s].fits_many([(fe, need), (oe, -bb)], reserved[s]):
            return None
        # later: the reload must fit beside the activations the stage holds (freed at their
        # earliest B and W ends); a later trigger (its B then waits for it) if the first does not
        tg = trig_group[g]
        while tg > g:
            est = fe + f_top[g] + b_from_top[tg]
            if est < oe - _EPS:
                break
            re_ = est + t_rel[s][c]
            if not any(a < re_ - _EPS and est < b - _EPS for a, b in plan.values()):
                ahead = forecast(s, now) + reserved[s]
                if mem[s].fits_many([(fe, need), (oe, -bb), (est, bb)], ahead):
                    return oe, est, tg
            tg -= 1
        return None

    heap: list[tuple[float, int, int]] = []
    seq = itertools.count()

    def wake(t: float, s: int) -> None:
        heapq.heappush(heap, (t, next(seq), s))

    def f_ready(g: int) -> float | None:
        j = nf[g]
        if j >= m:
            return None
        c = cap[g]
        if c is not None and nf[g] - nb[g] >= c:
            return None
        if g == 0:
            return 0.0
        e = f_end[g - 1][j]
        return None if e < 0 else e + lag_in[g]

    def issue_transfer(s: int, op: str, g: int, j: int, ready: float, now: float) -> float | None:
        """Start time of a transfer appended now, or None if it cannot be placed now."""
        lane = lanes[s][op == "RELOAD"]
        st = max(last_end[s], lane_free[lane], ready)
        c = table[g][1]
        if op == "RELOAD":
            bb = float(ob[s][c])
            if not mem[s].fits(st, bb):
                if not duplex:
                    return None
                # the simulator's memory wait (duplex lanes): the reload starts when the first
                # of the stage's offloads after which its bytes fit ends
                lim_s = (limits[s] or 0.0) * (1 + 1e-9) + 1e-6
                ends = stage_off_ends[s]  # increasing: a lane copies one at a time
                for oe in ends[bisect_right(ends, st + _EPS) :]:
                    if mem[s].level_at(oe) + bb <= lim_s:
                        if not mem[s].fits(oe, bb):
                            return None
                        st = oe
                        break
                else:
                    return None
        dur = t_off[s][c] if op == "OFFLOAD" else t_rel[s][c]
        rows[s].append(Action(op, j, c))
        lane_free[lane] = st + dur
        if op == "OFFLOAD":
            mem[s].add(st + dur, -float(ob[s][c]))
            stage_off_ends[s].append(st + dur)
            off_end[g][j] = st + dur
        else:
            mem[s].add(st, float(ob[s][c]))
            rel_end[g][j] = st + dur
        for s2 in members[lane]:
            wake(st + dur, s2)
        return st

    def process(s: int, now: float) -> None:
        if dev_free[s] > now + _EPS and not pending_reloads[s]:
            return  # busy, and no copy to issue (those are issued when an op ends, at now)
        mem[s].settle(last_end[s])
        # 1. transfers at the issue point of the compute op that just ended
        lo = last_op[s]
        if off_on and lo is not None and lo[0] == "F" and abs(last_end[s] - now) <= _EPS:
            g, j = lo[1], lo[2]
            c = table[g][1]
            if plan_on:
                if offloaded[g][j] and off_end[g][j] < 0:
                    lane_plan[lanes[s][0]].pop(("O", g, j), None)
                    issue_transfer(s, "OFFLOAD", g, j, f_end[g][j], now)
            elif (
                g < G - 1
                and ob[s][c] > 0
                and roomy[g]
                and not offloaded[g][j]
                and b_start[g][j] < 0
            ):
                do = rule.offload == "all"
                if rule.offload == "lazy" and limits[s] is not None:
                    nxt = max(float(m_f[s][cc]) for cc in range(v))
                    do = not mem[s].fits(now + _EPS, nxt * rule.headroom)
                if do:
                    offloaded[g][j] = True
                    issue_transfer(s, "OFFLOAD", g, j, f_end[g][j], now)
        # 2. reloads that were triggered, in trigger order, while memory allows
        pend = pending_reloads[s]
        while pend:
            g, j = pend[0]
            if off_end[g][j] < 0:
                break
            rt = reservation[g][j]
            if issue_transfer(s, "RELOAD", g, j, off_end[g][j], now) is None:
                break
            if rt >= 0:
                # the reload's own memory event replaces the reservation
                reserved[s].remove((rt, float(ob[s][table[g][1]])))
                reservation[g][j] = -1.0
                lane_plan[lanes[s][1]].pop(("R", g, j), None)
            pend.pop(0)
        # 3. compute
        if dev_free[s] > now + _EPS:
            return
        best: tuple[int, float, int, int] | None = None  # (class, key, group, mb)
        # An op listed next starts at max(device free, ready) in the simulator; one that was
        # ready while the device idled cannot start later, only after some other op.
        fresh = dev_free[s] >= now - _EPS
        t_hi, t_lo = now + _EPS, now - _EPS
        bg = -1  # the deepest group whose next B is ready (b_ready, inlined: the hot loop)
        for g in groups_of[s]:
            j = nb[g]
            if j >= nf[g]:
                continue
            rb = f_end[g][j]
            if rb < 0:
                continue
            if g < G - 1:
                e = b_end[g + 1][j]
                if e < 0:
                    continue
                e += lag_back[g]
                if e > rb:
                    rb = e
            if offloaded[g][j]:
                e = rel_end[g][j]
                if e < 0:
                    continue
                if e > rb:
                    rb = e
            if rb <= t_hi and (fresh or rb >= t_lo) and g > bg:
                bg = g
        if bg >= 0:
            best = (0, -bg, bg, nb[bg])
        waiting: tuple[float, int, int] | None = None  # (start, group, mb) of a waiting F
        planned: dict[int, tuple[float, float, int]] = {}  # group -> (offload end, reload trigger)
        wait_plan: tuple[float, float, int] | None = None
        if best is None:
            for g in groups_of[s]:
                r = f_ready(g)
                if r is None or r > now + _EPS:
                    continue
                c = table[g][1]
                if not fresh and r < now - _EPS:
                    continue  # listed next, the simulator would have run it earlier
                d = float(t_f[s][c])
                need = float(m_f[s][c])
                if rule.reserve:
                    for g2 in groups_of[s]:
                        if g2 > g and nf[g2] < nf[g]:
                            need += float(m_f[s][table[g2][1]])
                fits = mem[s].fits(now + d, need)
                if fits and plan_on and reserved[s]:
                    fits = mem[s].fits_many([(now + d, need)], forecast(s, now) + reserved[s])
                if plan_on and trig_group[g] >= 0 and (rule.eager or not fits):
                    pl = plan_offload(s, g, now + d, need, now)
                    if pl is not None:
                        planned[g] = pl
                        fits = True
                if not fits:
                    if plan_on and fresh:
                        lim_s = (limits[s] or 0.0) * (1 + 1e-9) + 1e-6
                        # the simulator's memory wait: the F ends when the first of the stage's
                        # offloads after which it fits ends (as resident, or offloaded in turn)
                        ends = stage_off_ends[s]  # increasing: a channel copies one at a time
                        for fe in ends[bisect_right(ends, now + d + _EPS) :]:
                            if mem[s].level_at(fe) + need > lim_s:
                                continue  # the simulator's F would wait for a later one
                            pl = None
                            ok = mem[s].fits(fe, need) and mem[s].fits_many(
                                [(fe, need)], forecast(s, now) + reserved[s]
                            )
                            if not ok and trig_group[g] >= 0:
                                pl = plan_offload(s, g, fe, need, now)
                                ok = pl is not None
                            if ok:
                                if waiting is None or fe - d < waiting[0]:
                                    waiting = (fe - d, g, nf[g])
                                    wait_plan = pl
                                break
                    elif rule.wait and fresh:
                        tw = mem[s].wait_until(now + d, float(m_f[s][c]))
                        if tw is not None and (waiting is None or tw - d < waiting[0]):
                            waiting = (tw - d, g, nf[g])
                    continue
                key = (1, -g if rule.deep_first else nf[g] * G + g, g, nf[g])
                if best is None or key < best:
                    best = key
        if best is None:
            wk, wg = 0, -1  # the W of least (microbatch, -group) that is ready (w_ready, inlined)
            for g in groups_of[s]:
                j = nw[g]
                if j >= nb[g]:
                    continue
                rw = b_end[g][j]
                if rw >= 0 and rw <= t_hi and (fresh or rw >= t_lo):
                    k = j * G - g
                    if wg < 0 or k < wk:
                        wk, wg = k, g
            if wg >= 0:
                best = (2, wk, wg, nw[wg])
        if best is None and waiting is not None:
            # nothing else to run: the forward waits for the copy that frees its memory
            now, g, j = waiting
            best = (1, 0, g, j)
            planned.clear()
            if wait_plan is not None:
                planned[g] = wait_plan
        if best is None:
            return
        kind, _k, g, j = best
        c = table[g][1]
        if kind == 0:
            d = float(t_b[s][c])
            rows[s].append(Action("B", j, c))
            b_start[g][j] = now
            b_end[g][j] = now + d
            nb[g] += 1
            mem[s].add(now + d, float(m_b[s][c]))
            if g > 0:
                wake(now + d + lag_back[g - 1], table[g - 1][0])
            # trigger the reload of the group reload_lead upstream (or all below the top)
            if plan_on:
                targets = trig_wait.pop((g, j), [])
            else:
                targets = _reload_targets(g, rule.reload_lead, G)
            for tg in targets:
                if offloaded[tg][j] and rel_end[tg][j] < 0:
                    ts = table[tg][0]
                    if (tg, j) not in pending_reloads[ts]:
                        pending_reloads[ts].append((tg, j))
                    wake(now, ts)
            op = "B"
        elif kind == 1:
            d = float(t_f[s][c])
            rows[s].append(Action("F", j, c))
            f_end[g][j] = now + d
            nf[g] += 1
            mem[s].add(now + d, float(m_f[s][c]))
            pl = planned.get(g)
            if pl is not None:
                oe, est, tg = pl
                trig_wait.setdefault((tg, j), []).append(g)
                bb = float(ob[s][c])
                offloaded[g][j] = True
                reservation[g][j] = est
                reserved[s].append((est, bb))
                lane_plan[lanes[s][0]][("O", g, j)] = (now + d, oe)
                lane_plan[lanes[s][1]][("R", g, j)] = (est, est + t_rel[s][c])
            if g < G - 1:
                wake(now + d + lag_in[g + 1], table[g + 1][0])
            op = "F"
        else:
            d = float(t_w[s][c])
            rows[s].append(Action("W", j, c))
            nw[g] += 1
            mem[s].add(now + d, float(m_w[s][c]))
            op = "W"
        dev_free[s] = now + d
        last_end[s] = now + d
        last_op[s] = (op, g, j)
        wake(now + d, s)

    for s in range(p):
        wake(0.0, s)
    while heap:
        now, _, s = heapq.heappop(heap)
        process(s, now)
    if any(nw[g] < m for g in range(G)):
        return None
    return rows


def _plan_triggers(
    pb: Problem,
    rule: ListRule,
    f_top: list[float],
    b_from_top: list[float],
    t_off: list[list[float]],
    t_rel: list[list[float]],
) -> list[int]:
    """For the "plan" rule, per group, the nearest deeper group from whose B start the backward
    chain to the group's own B lasts at least its reload plus ``margin`` offload times, and
    that starts no earlier than an offload after the group's F could end; -1 where there is
    none (the group's activations are never offloaded)."""
    G = pb.num_stages * pb.num_chunks
    out = [-1] * G
    for g in range(G - 1):
        s, c = pb.group_table[g]
        need = t_rel[s][c] + rule.margin * t_off[s][c]
        for tg in range(g + 1, G):
            if b_from_top[g] - b_from_top[tg] >= need - _EPS:
                if f_top[g] + b_from_top[tg] >= t_off[s][c] - _EPS:
                    out[g] = tg
                break
    return out


def _chains(
    pb: Problem, lag_in: list[float], lag_back: list[float]
) -> tuple[list[float], list[float], list[float]]:
    """Per group, the least time from its F's end to the top group's F end; from the top
    group's B start to its own B start; and from its F's end to its B's end."""
    G = pb.num_stages * pb.num_chunks
    table = pb.group_table
    t_f, t_b = pb.cost("t_f").tolist(), pb.cost("t_b").tolist()
    f_top = [0.0] * G
    b_from_top = [0.0] * G
    for g in range(G - 2, -1, -1):
        s, c = table[g + 1]
        f_top[g] = f_top[g + 1] + lag_in[g + 1] + float(t_f[s][c])
        b_from_top[g] = b_from_top[g + 1] + float(t_b[s][c]) + lag_back[g]
    b_end_after = [
        f_top[g] + b_from_top[g] + float(t_b[table[g][0]][table[g][1]]) for g in range(G)
    ]
    return f_top, b_from_top, b_end_after


def _fitted_depths(
    pb: Problem,
    groups_of: list[list[int]],
    limits: list[float | None],
    m_f: list[list[float]],
) -> list[float]:
    """1F1B's depths (G - g) scaled down per stage so that its groups' in-flight activations at
    those depths fit the stage's limit (never scaled up)."""
    G = pb.num_stages * pb.num_chunks
    depth = [float(G - g) for g in range(G)]
    for s, gs in enumerate(groups_of):
        lim = limits[s]
        need = sum(depth[g] * float(m_f[s][pb.group_table[g][1]]) for g in gs)
        if lim is None or need <= lim:
            continue
        k = lim / need
        for g in gs:
            depth[g] *= k
    return depth


def _reload_targets(g: int, lead: int, G: int) -> list[int]:
    """Groups whose reload starts when the B of group g starts."""
    if g == G - 1:
        # the top group triggers every group within ``lead`` of it
        return [x for x in range(max(0, G - 1 - lead), G - 1)]
    t = g - lead
    return [t] if t >= 0 else []


def heuristic_schedules(problem: Problem) -> list[Schedule]:
    """Every list-scheduling rule's schedule that the simulator accepts, best first."""
    from .feasibility import minimal_memory_schedule

    out: list[Schedule] = []
    for rule in default_rules(problem):
        sched = run_rule(problem, rule)
        if sched is not None and sched.evaluation is not None and sched.evaluation.feasible:
            out.append(sched)
    seq = minimal_memory_schedule(problem)
    if seq.evaluation is not None and seq.evaluation.feasible:
        out.append(seq)
    out.sort(key=lambda s: s.evaluation.makespan if s.evaluation and s.evaluation.makespan else 0)
    return out


def run_rule(problem: Problem, rule: ListRule) -> Schedule | None:
    """The schedule of one rule, evaluated (None if the greedy got stuck)."""
    rows = list_schedule(problem, rule)
    if rows is None:
        return None
    ev = evaluate(problem, rows)
    return Schedule.built(
        problem_hash=problem.hash,
        generator="optpipe-heuristic",
        params={"rule": rule.name},
        actions=rows,
        evaluation=ev,
        problem=problem,
    )
