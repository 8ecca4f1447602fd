"""The simulator's timing engine: an event loop over flat op ids (``sim_ops.OpArrays``).

Each stage's compute queue and each copy lane is a work item; an item runs its ops in list order
as far as their dependencies have ended, and parks on the first op it waits for until that op
ends. A shared copy lane starts the ready head transfer that can start first. The memory wait of
forwards (and, with duplex lanes, of reloads) is decided here from the memory events of the
stage's transfers timed so far. The rules are the simulator's docstring's.

An OFFLOAD's bytes leave at its settle point (``sim_memory``): the start of the first compute
action of its stage that starts at or after its copy ends, or of the first RELOAD listed after it that
starts then. So an F starting at ``t`` counts the offloads whose copies ended by ``t`` (each
settles at or before it), and one that waits starts when the copy it waits for ends (it is that
offload's settle point); a RELOAD counts those whose copies ended by its start, as before (it
settles them itself).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np

from .lanes import is_duplex, stage_lanes
from .problem import Problem
from .schedule import Violation
from .sim_deadlock import deadlock_violation
from .sim_memory import MEMORY_TOLERANCE
from .sim_ops import OpArrays
from .sim_overlimit import OverLimit, certificate_tables


@dataclass
class Timing:
    """Start and end of every op id, and each F or RELOAD that waited for memory -> the OFFLOAD
    op it waited for."""

    start: np.ndarray
    end: np.ndarray
    waited: dict[int, int]


def time_ops(
    problem: Problem,
    ops: OpArrays,
    memory_wait: bool,
    violations: list[Violation],
    limits: list[float | None] | None = None,
    certify: bool = False,
) -> Timing | None:
    """ASAP start and end of every op, and the memory waits taken; None (with a deadlock
    violation appended to ``violations``) if stuck. ``limits``: the per-stage memory the waits
    keep within (default the problem's limits; a schedule's ``memory_budget`` lowers them).
    ``certify`` (without ``memory_wait`` only): raise ``OverLimit`` as soon as the timing so far
    proves that the memory curve goes over a limit (``sim_overlimit``'s certificate)."""
    pb = problem
    p, n = pb.num_stages, ops.n
    dep = ops.dep
    is_c = ops.is_compute
    off = ops.offset.tolist()
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
    comp_rows = per_stage_rows(np.flatnonzero(is_c), (*ops.dep, *ops.lag, ops.dur))
    # transfers as (op, dep0, dep1, lag0, lag1, duration), per transfer queue: queue 2s
    # holds stage s's OFFLOADs (and its RELOADs unless duplex), queue 2s + 1 its RELOADs
    # when duplex; each queue keeps list order and runs on one lane
    duplex = is_duplex(pb)
    stage_xfers = per_stage_rows(np.flatnonzero(~is_c), (*ops.dep[:2], *ops.lag, ops.dur))
    xfer_rows: list[list[Any]] = [[] for _ in range(2 * p)]
    codes = ops.code.tolist()
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
    # memory wait (see the simulator's docstring): per stage the compute ops' running level, and
    # the timed transfers' memory events (time, cumulative delta, is-offload) in list order,
    # which is also time order since a stage's transfers run one at a time in list order
    # (a stage without transfers has no offload to wait for: its F's never wait)
    lims = pb.memory_limits() if limits is None else limits
    cap = [
        None
        if lim is None or not memory_wait or not (xfer_q[2 * s] or xfer_q[2 * s + 1])
        else lim * (1 + MEMORY_TOLERANCE) + 1e-6
        for s, lim in enumerate(lims)
    ]
    # the over-limit certificate's thresholds (``sim_overlimit``; without the memory wait only)
    chk: list[float | None] = [None] * p
    if certify and not memory_wait:
        cert = certificate_tables(pb, ops, lims, [bool(q) for q in xfer_q])
        chk = cert.threshold
    track = [c is not None or k is not None for c, k in zip(cap, chk, strict=True)]
    if any(track):
        mdelta, is_off, waits_for_memory, xbefore, xbefore1, rbefore, cbefore = ops.memory_tables(
            pb, duplex
        )
    # with duplex lanes a RELOAD may wait for memory too (``reload_start``)
    reload_waits = [duplex and c is not None for c in cap]
    comp_level = [0.0] * p
    # per transfer queue (a queue's transfers are timed in list order and in time order)
    xev_t: list[list[float]] = [[] for _ in range(2 * p)]
    xev_cum: list[list[float]] = [[] for _ in range(2 * p)]
    xev_off: list[list[bool]] = [[] for _ in range(2 * p)]
    xev_rcum: list[list[float]] = [[] for _ in range(2 * p)]  # the reloads' part of xev_cum
    reloaded = [0.0] * p  # bytes of the stage's timed reloads
    waited: dict[int, int] = {}  # F or RELOAD op -> the OFFLOAD op it waited for
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
        rcum = xev_rcum[q]
        rcum.append((rcum[-1] if rcum else 0.0) + (0.0 if is_off[op] else dm))
        if is_off[op]:
            xev_t[q].append(e)
            xev_off[q].append(True)
        else:
            xev_t[q].append(t)
            xev_off[q].append(False)
            reloaded[q // 2] += dm

    def memory_start(s: int, op: int, t: float, du: float) -> tuple[float, int]:
        """Start of F ``op`` (ready at ``t``) under the memory wait, and -1; or (t, the op
        id of an earlier-listed transfer of the stage that must be timed first). Offloads
        count when their copy ended by the F's start, reloads when they start by its end."""
        if duplex:
            return memory_start_duplex(s, op, t, du)
        lim = cap[s]
        assert lim is not None
        base = comp_level[s] + mdelta[op]
        nb = xbefore[op]
        q = 2 * s
        times, cum, rcum = xev_t[q], xev_cum[q], xev_rcum[q]
        ntimed = len(times)

        def level(x: float, hi: int) -> float:
            """Offloads (of the first ``hi`` events) ended by ``x``, reloads started by
            ``x + du`` (events are in time order: those between are reloads' or skipped)."""
            i = bisect_right(times, x, 0, hi)
            j = bisect_right(times, x + du, i, hi)
            lv = cum[i - 1] if i else 0.0
            if j > i:
                lv += rcum[j - 1] - (rcum[i - 1] if i else 0.0)
            return lv

        if ntimed < nb:
            # not all earlier transfers are timed: decide now only if it fits even when
            # every earlier reload has allocated and no untimed offload has freed
            if base + level(t, ntimed) + rbefore[op] - reloaded[s] <= lim:
                return t, -1
            return t, xfer_q[q][ntimed]
        if base + level(t, nb) <= lim:
            return t, -1
        offs = xev_off[q]
        k = bisect_right(times, t, 0, nb)
        while k < nb:
            if offs[k]:
                tk = times[k]
                if base + level(tk, nb) <= lim:  # tk > t: a real wait, F settles it
                    waited[op] = xfer_q[q][k]
                    return tk, -1
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
        if len(to) < no or len(tr) < nr:
            # as in ``memory_start``: fits even with every earlier reload allocated and no
            # untimed offload freed, or wait until the next untimed one is timed
            i, j = bisect_right(to, t), bisect_right(tr, t + du)
            lvl = base + (co[i - 1] if i else 0.0) + (cr[j - 1] if j else 0.0)
            if lvl + rbefore[op] - reloaded[s] <= lim:
                return t, -1
            return t, (xfer_q[qo][len(to)] if len(to) < no else xfer_q[qr][len(tr)])
        i, j = bisect_right(to, t, 0, no), bisect_right(tr, t + du, 0, nr)
        if base + (co[i - 1] if i else 0.0) + (cr[j - 1] if j else 0.0) <= lim:
            return t, -1
        k = i
        while k < no:  # every event of queue 2s is an offload's end
            tk = to[k]
            last = k
            while last + 1 < no and to[last + 1] <= tk:
                last += 1
            while j < nr and tr[j] <= tk + du:
                j += 1
            if base + co[last] + (cr[j - 1] if j else 0.0) <= lim:  # tk > t: a wait
                waited[op] = xfer_q[qo][k]
                return tk, -1
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

    def over_limit(s: int, op: int, t: float, e: float, base: float) -> bool | None:
        """The certificate (``sim_overlimit``): F ``op`` of stage ``s`` runs from ``t`` to ``e``
        without the memory wait, the compute ops up to it leave ``base``; True when the curve's
        step at ``e`` is certainly over the limit, None while a transfer of the stage listed
        before it is not timed yet (decided once it is: ``pending``)."""
        tol = cert.tol
        h = e + cert.window[s] + tol  # no event of the step at e lies after h
        qo = 2 * s
        to = xev_t[qo]
        no = xbefore[op]
        if len(to) < no:
            return None
        if duplex:
            qr = qo + 1
            tr = xev_t[qr]
            nr = xbefore1[op]
            if len(tr) < nr:
                return None
            # a reload starting between t and h may settle offloads that ended after t
            i = bisect_right(tr, t - tol, 0, nr)
            wide = cert.reload_next[op] or (i < nr and tr[i] <= h)
            k = bisect_right(to, h if wide else t + tol, 0, no)
            j = bisect_right(tr, e, 0, nr)
            cr = xev_cum[qr]
            moved = (xev_cum[qo][k - 1] if k else 0.0) + (cr[j - 1] if j else 0.0)
        else:
            offs = xev_off[qo]
            i = bisect_right(to, t - tol, 0, no)
            wide = cert.reload_next[op]
            while not wide and i < no and to[i] <= h:
                wide = not offs[i]
                i += 1
            k = bisect_right(to, h if wide else t + tol, 0, no)
            j = bisect_right(to, e, 0, no)
            cum, rcum = xev_cum[qo], xev_rcum[qo]
            freed = (cum[k - 1] - rcum[k - 1]) if k else 0.0
            moved = freed + (rcum[j - 1] if j else 0.0)
        lim = chk[s]
        assert lim is not None
        return base + moved > lim

    # per stage, the certificate's checks still undecided: (op, start, end, base), list order
    pending: list[list[tuple[int, float, float, float]]] = [[] for _ in range(p)]

    def check(s: int, op: int, t: float, e: float, base: float) -> None:
        """Raise ``OverLimit`` when the certificate holds now; keep the check for later when
        it cannot be decided yet."""
        if pending[s]:
            pending[s].append((op, t, e, base))
            return
        over = over_limit(s, op, t, e, base)
        if over is None:
            pending[s].append((op, t, e, base))
        elif over:
            raise OverLimit(s)

    def recheck(s: int) -> None:
        """The stage's undecided checks that a newly timed transfer decides, in list order."""
        todo = pending[s]
        while todo:
            over = over_limit(s, *todo[0])
            if over is None:
                return
            if over:
                raise OverLimit(s)
            todo.pop(0)

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
            if track[s]:
                record(op, q, t, free)
                if pending[s]:
                    recheck(s)
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
            if track[q // 2]:
                record(op, q, t, e)
                if pending[q // 2]:
                    recheck(q // 2)
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
            if cap[s] is None and chk[s] is None:
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
            elif cap[s] is None:
                # no memory wait; the over-limit certificate checked at each allocating F
                level = comp_level[s]
                ok = cert.checked
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
                    start[op] = t
                    free = t + du
                    end[op] = free
                    if ok[op]:
                        check(s, op, t, free, level + mdelta[op])
                    level += mdelta[op]
                    k += 1
                    if op in waiters:
                        wake(op)
                comp_level[s] = level
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
        violations.append(
            deadlock_violation(pb, ops, comp_ql, comp_ptr, xfer_q, xfer_ptr, first_blocker)
        )
        return None
    # (drops the sentinel)
    return Timing(np.fromiter(start, float, n), np.fromiter(end, float, n), waited)
