"""The offload-aware list scheduler: one event-driven greedy that runs a ``ListRule``.

Each device runs, whenever it is free, the ready op of
highest priority: B > F > W (an F only when its activation fits the memory limit at the moment
it finishes, and only while the stage has fewer than ``inflight`` microbatches in flight). Every
transfer is issued the way the simulator issues it (after the compute op listed before it), so
the simulator reproduces the greedy's timing; the simulator still judges every result.

The simulator runs each op as soon as its list position and dependencies allow; the one wait it
knows is the memory wait (an F that would not fit starts when an earlier offload of its stage
that makes it fit ends: it is then that offload's settle point). An offload's bytes leave at its
settle point (``sim_memory``): for an F, those whose copy ended by its start count (an F is
checked at its start, holding its bytes from there: conservative only against a reload that
starts while it runs); for a reload, those whose copy ended by its start (it settles them). So a forward that is ready but does not fit either waits that way (rules with
``wait``, only when no B or W is ready to fill the time) or is put after the next op that becomes
ready later (the device idles until then).

The rules (``list_rules``) say which transfers it issues and how deep each stage may run ahead.
"""

from __future__ import annotations

import gc
import heapq
import itertools
from bisect import bisect_right

from ..schedule.lanes import is_duplex, stage_lanes
from ..schedule.problem import Problem
from ..schedule.schedule import Action
from .list_memory import EPS as _EPS
from .list_memory import StageMemory
from .list_rules import ListRule, fitted_depths, group_chains, plan_triggers, reload_targets


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
    mem = [StageMemory(limits[s]) for s in range(p)]
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
        depth = fitted_depths(pb, groups_of, limits, m_f)
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
        f_top, b_from_top, b_end_after = group_chains(pb, lag_in, lag_back)
    if plan_on:
        trig_group = plan_triggers(pb, rule, f_top, b_from_top, t_off, t_rel)
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
        s: int, g: int, fe: float, need: float, now: float, fs: float
    ) -> tuple[float, float, int] | None:
        """(offload end, reload start, trigger group) if the activation of the F of group g
        that starts at ``fs`` and ends at ``fe`` can be offloaded: the channel is free then and the copy crosses no
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
        if not mem[s].fits_many([(fs, need), (oe, -bb)], reserved[s]):
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
                if mem[s].fits_many([(fs, need), (oe, -bb), (est, bb)], ahead):
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
                # checked at its start: the offloads whose copy ended by then have settled
                fits = mem[s].fits(now, need)
                if fits and plan_on and reserved[s]:
                    fits = mem[s].fits_many([(now, need)], forecast(s, now) + reserved[s])
                if plan_on and trig_group[g] >= 0 and (rule.eager or not fits):
                    pl = plan_offload(s, g, now + d, need, now, now)
                    if pl is not None:
                        planned[g] = pl
                        fits = True
                if not fits:
                    if plan_on and fresh:
                        lim_s = (limits[s] or 0.0) * (1 + 1e-9) + 1e-6
                        # the simulator's memory wait: the F starts when the first of the
                        # stage's offloads after which it fits ends (as resident, or offloaded
                        # in turn)
                        ends = stage_off_ends[s]  # increasing: a channel copies one at a time
                        for fs in ends[bisect_right(ends, now + _EPS) :]:
                            if mem[s].level_at(fs) + need > lim_s:
                                continue  # the simulator's F would wait for a later one
                            pl = None
                            ok = mem[s].fits(fs, need) and mem[s].fits_many(
                                [(fs, need)], forecast(s, now) + reserved[s]
                            )
                            if not ok and trig_group[g] >= 0:
                                pl = plan_offload(s, g, fs + d, need, now, fs)
                                ok = pl is not None
                            if ok:
                                if waiting is None or fs < waiting[0]:
                                    waiting = (fs, g, nf[g])
                                    wait_plan = pl
                                break
                    elif rule.wait and fresh:
                        tw = mem[s].wait_until(now, float(m_f[s][c]))
                        if tw is not None and (waiting is None or tw < waiting[0]):
                            waiting = (tw, g, nf[g])
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
                targets = reload_targets(g, rule.reload_lead, G)
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
