"""Cheap, valid lower bounds on the makespan of any schedule of a problem.

Every bound holds for every valid schedule (any order, fused or split backward, any offload
decision), so ``lower_bound(problem) <= makespan`` of anything the simulator accepts. Notation:
layer groups ``g = 0..G-1`` in model order (``G = p*v``), ``F_g, B_g, W_g`` their op times
(with a fused backward cheaper than B + W, ``B_g = min(B, BW)`` and ``W_g = min(B + W, BW) - B_g``),
``cf_g`` the p2p lag on the forward edge ``g -> g+1`` and ``cb_g`` on the backward edge
``g+1 -> g`` (the sending stage's ``t_comm`` when the two groups sit on different devices, else 0).
``EF_g = sum_{g'<g} (F_g' + cf_g')`` is the earliest any F of group g can start.

1. **Work** (per device d): nothing runs on d before ``head_d = min_c EF_g(d,c)``, and d then
   executes all its ops one at a time: ``head_d + sum of F+B+W on d``.
2. **Forward throughput** (per group g): the m forwards of group g run one at a time from
   ``EF_g``; the last one ends no earlier than ``EF_g + m F_g`` and its microbatch still needs the
   rest of the forward chain, the whole backward chain and ``W_0``.
3. **Backward throughput** (per group g): no B of group g starts before the first microbatch has
   gone forward through every group and backward down to g; the m backwards of g then run one at
   a time, and the last needs the rest of the backward chain (then ``W_0``) or its own ``W_g``.
4. **Memory-time with copy channels** (per device d, with a memory limit): each activation of
   (d, c) is resident from its F end to its B end, at least ``R_g + B_g`` (``R_g`` = the forward
   and backward chain above g), except for the part that is offloaded, resident at least
   ``t_off + t_rel + B_g``; the W-part stays until W ends (at least ``W_g``). While an F runs,
   its device frees nothing but by an offload ending (B and W run on the device), and the F
   adds its activation when it ends, so during the F at most ``limit - act`` is held: ``act * F``
   of the limit's byte-seconds per F are unusable, less ``moved * F`` for each offload that
   ends inside it. The integral of memory over time plus the unusable part is at most
   ``limit * makespan``. Each offloaded activation also keeps the
   device's copy lane busy ``t_off + t_rel`` (one lane for both directions), or with duplex lanes
   its offload lane ``t_off`` and its reload lane ``t_rel``; every copy runs within the makespan,
   and as all copies move bytes at the same two bandwidths, the busier lane is the same for all,
   so with duplex each activation counts ``max(t_off, t_rel)`` there (``lanes.lane_seconds``). So
   ``makespan >= T`` for the least T at which the copies that fit in T save enough byte-seconds
   (a fractional knapsack over which activations to offload: a relaxation, hence a valid bound).
   Devices of one channel group (GPUs behind one PCIe switch) share that channel's lanes, so the
   copies all of them need, each the least lane time that saves its own shortfall at T, fit in T
   together: with two GPUs per switch this is what binds where copies are slow.
5. **One thing at a time** (per device d, when no two of its activations fit together within
   the limit): while an F runs nothing else is resident but an activation whose offload ends
   inside it (the F adds its own when it ends), so the device's F runs and activation
   residencies are disjoint intervals. Where no activation fits beside a W-part either, two
   W-parts never meet (the later one's B ran while the earlier W-part was held, beside its own
   activation) and the W-parts join the disjoint intervals; otherwise they are left out. So
   ``makespan >= head + sum(F + resident [+ W]) + tail`` less what offloads save (``resident -
   trip - B`` each, plus the F their offload may end in), with the channel as in 4. ``head`` is
   the earliest F start of d; ``tail`` the least time the last interval leaves after it (the
   backward chain below, less the W-part's own W where it counts). Not used where an offload
   moves part of an activation.
6. **Drain** (per device d, with a memory limit): let ``t*`` be when the B-part of d's last
   backward ends. Every F and backward of d has then started, and the rest of the backward chain
   below keeps the makespan at least ``below[g]`` after ``t*``; meanwhile d can only finish that
   backward and run the W's still pending. Just before ``t*`` the backward's activation and the
   W-part of every other pending W are all held (a W-part is what stays from B end to W end,
   ``m_f + m_b``, never offloaded), so the limit caps how much W time is left to fill the wait:
   ``makespan >= head + work + below_min - (own + max W time of the W-parts fitting beside one
   activation)``, where ``own`` is the most the last backward and its own W can run past its
   B-part. It binds where the last stage could otherwise drain the pipeline behind a long tail of
   deferred W's, as the unlimited optimum (ZB-H1) does.
7. **Fill** (per device d, with a memory limit): no backward of d starts before
   ``t1 = min_g (EF_top + F_top + down_g)`` over d's groups (the first microbatch must go up the
   whole chain and back down to d), so until then d runs only forwards. Let ``e`` be the end of
   the last forward d starts before ``t1``: no backward of d runs before ``e`` (d is busy), so
   every activation those forwards made is held at ``e`` but what an offload ended by ``e`` moved
   to the host, and offloads run one at a time (on d's lane) from d's first forward end. So at
   most ``n`` forwards start before ``t1``, the most whose activations fit in the limit plus what
   the offloads that can end by then move (an integer count per chunk; a chunk's forward needs
   the lower chunk's of its microbatch first). Of ``[head, t1]``, at least ``t1 - head`` less
   their time is idle, which adds to argument 1, and to argument 6 (it comes before ``t*``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .lanes import lane_seconds
from .problem import Problem
from .simulator import MEMORY_TOLERANCE


@dataclass(frozen=True)
class BoundParts:
    work: float
    forward: float
    backward: float
    memory: float
    drain: float = 0.0
    fill: float = 0.0

    @property
    def value(self) -> float:
        return max(self.work, self.forward, self.backward, self.memory, self.drain, self.fill)

    @property
    def binding(self) -> str:
        parts = {
            "work": self.work,
            "forward": self.forward,
            "backward": self.backward,
            "memory": self.memory,
            "drain": self.drain,
            "fill": self.fill,
        }
        return max(parts, key=lambda k: parts[k])


def lower_bound(problem: Problem) -> float:
    """A valid lower bound on the makespan of every schedule of ``problem``."""
    return bound_parts(problem).value


def bound_parts(problem: Problem) -> BoundParts:
    pb = problem
    p, m, v = pb.num_stages, pb.num_microbatches, pb.num_chunks
    G = p * v
    table = pb.group_table
    t_f, t_b, t_w, t_c = pb.cost("t_f"), pb.cost("t_b"), pb.cost("t_w"), pb.cost("t_comm")
    t_bw = pb.cost("t_bw")
    F = [float(t_f[table[g]]) for g in range(G)]
    # A backward hands its gradient on after B (split) or BW (fused), whichever is shorter, and
    # finishes its group's work no earlier than min(B + W, BW): ``B`` below is the hand-on time
    # and ``W`` the least extra time until the group's backward work is done.
    B = [min(float(t_b[table[g]]), float(t_bw[table[g]])) for g in range(G)]
    W = [min(float(t_b[table[g]] + t_w[table[g]]), float(t_bw[table[g]])) - B[g] for g in range(G)]
    cf = [0.0] * G  # forward edge g -> g+1
    cb = [0.0] * G  # backward edge g+1 -> g
    for g in range(G - 1):
        (s0, c0), (s1, c1) = table[g], table[g + 1]
        if s0 != s1:
            cf[g] = float(t_c[s0, c0])
            cb[g] = float(t_c[s1, c1])
    EF = [0.0] * G
    for g in range(1, G):
        EF[g] = EF[g - 1] + F[g - 1] + cf[g - 1]
    # backward chain from the top down to group g (exclusive of B_g): time after the last F of
    # the chain ends until B_g may start
    down = [0.0] * G  # down[g] = sum_{g' > g} B_g' + sum_{g' >= g} cb_g' (g' < G-1)
    for g in range(G - 2, -1, -1):
        down[g] = down[g + 1] + B[g + 1] + cb[g]
    fwd_rest = [0.0] * G  # fwd_rest[g] = time from the end of F_g to the end of F_{G-1}
    for g in range(G - 2, -1, -1):
        fwd_rest[g] = fwd_rest[g + 1] + cf[g] + F[g + 1]
    # below[g] = time from the end of B_g until the end of W_0 via the rest of the backward chain
    below = [0.0] * G
    below[0] = W[0]
    for g in range(1, G):
        below[g] = cb[g - 1] + B[g - 1] + below[g - 1]

    # 1. work (each device's head and work serve argument 6 too)
    heads = [min(EF[pb.group_of(s, c)] for c in range(v)) for s in range(p)]
    works = [m * float(t_f[s].sum() + np.minimum(t_b[s] + t_w[s], t_bw[s]).sum()) for s in range(p)]
    work_lb = max(h + w for h, w in zip(heads, works, strict=True))
    # 2. forward throughput
    fwd_lb = 0.0
    for g in range(G):
        after = fwd_rest[g] + down[0] + B[0] + W[0]
        fwd_lb = max(fwd_lb, EF[g] + m * F[g] + after)
    # 3. backward throughput
    top = EF[G - 1] + F[G - 1]
    bwd_lb = 0.0
    for g in range(G):
        first_b = top + down[g]
        tail = max(W[g], below[g])
        bwd_lb = max(bwd_lb, first_b + m * B[g] + tail)
    # 4. memory-time (5. one thing at a time and 6. drain in the same loop over devices)
    mem_lb = 0.0
    drain_lb = 0.0
    fill_lb = 0.0
    limits = pb.memory_limits()
    m_f, m_w = pb.cost("m_f"), pb.cost("m_w")
    ob = pb.cost("offload_bytes")
    m_b = pb.cost("m_b")
    signs_ok = bool((m_b <= 0).all() and (m_w <= 0).all())
    # argument 4's terms per copy channel: (full, limit, options) of each of its devices
    by_channel: dict[int, list[tuple[float, float, list[tuple[float, float, int]]]]] = {}
    channel = pb.channel_of()
    for s in range(p):
        lim = limits[s]
        if lim is None or not signs_ok:
            continue
        # per chunk: (group, resident, activation, W-part, bytes moved, offload, reload seconds)
        chunks = []
        for c in range(v):
            g = pb.group_of(s, c)
            moved = float(ob[s, c]) if pb.offload is not None else 0.0
            t_off = pb.offload_time(s, c)
            trip = t_off + pb.reload_time(s, c)
            resident = fwd_rest[g] + down[g] + B[g]
            lane = lane_seconds(pb, s, c) if pb.offload is not None else 0.0
            chunks.append(
                (g, resident, float(m_f[s, c]), -float(m_w[s, c]), moved, t_off, trip, lane)
            )
        f_longest = max(F[g] for g, *_ in chunks)
        full = 0.0  # resident (or unusable) byte-seconds if nothing is offloaded
        options: list[tuple[float, float, int]] = []  # (saving, lane seconds, count) per chunk
        for g, resident, act, wpart, moved, _t_off, trip, lane in chunks:
            # while an F runs, nothing of its device frees memory but an offload ending: the
            # level stays limit - act until then (the F adds act when it ends), so act * F of
            # the limit's byte-seconds are unusable per F
            full += m * (act * resident + max(wpart, 0.0) * W[g] + max(act, 0.0) * F[g])
            if pb.offload is not None:
                # an offloaded part is resident at least trip + B (its copies and its B) instead of
                # ``resident``, and its offload may end inside one F, giving back up to moved * F
                # of that F's unusable byte-seconds
                saving = moved * (resident - (trip + B[g]) + f_longest)
                if saving > 0:
                    options.append((saving, lane, m))
        by_channel.setdefault(channel[s], []).append((full, lim, options))
        room = lim * (1 + MEMORY_TOLERANCE) + 1e-6
        # 6. drain
        drain = _drain_bound(pb, s, room, B, below, heads[s] + works[s])
        if drain is not None:
            drain_lb = max(drain_lb, drain)
        # 7. fill: idle before d's first backward, on top of argument 1 (and of 6 where it holds)
        idle = _fill_idle(pb, s, room, EF, F, top + min(down[g] for g, *_ in chunks))
        if idle > 0:
            fill_lb = max(fill_lb, idle + (heads[s] + works[s] if drain is None else drain))
        # 5. one thing at a time: when no two of the stage's activations and W-parts fit together
        acts = [act for _, _, act, *_ in chunks]
        wparts = [w for _, _, _, w, *_ in chunks if w > 0]
        partial = any(0 < moved < act for _, _, act, _, moved, *_ in chunks)
        if partial or min(acts) <= 0 or 2 * min(acts) <= room:
            continue  # two activations fit together
        # W-parts count only where none fits beside an activation; otherwise they may be held
        # at any time and the argument leaves them out
        w_alone = not wparts or min(acts) + min(wparts) > room
        span = 0.0  # seconds the stage's memory is surely occupied, nothing offloaded
        single: list[tuple[float, float, int]] = []
        tail = float("inf")
        for g, resident, _act, wpart, moved, t_off, trip, lane in chunks:
            w_g = W[g] if wpart > 0 and w_alone else 0.0
            span += m * (F[g] + resident + w_g)
            tail = min(tail, max(0.0, below[g] - w_g))
            if moved > 0:
                saving = resident - (trip + B[g]) + min(f_longest, t_off)
                if saving > 0:
                    single.append((saving, lane, m))
        head = min(EF[g] for g, *_ in chunks)
        mem_lb = max(mem_lb, least_time_for_memory(span + head + tail, 1.0, single))
    # 4. per copy channel: a device alone on its own, the devices of a group together
    for devices in by_channel.values():
        alone = len(devices) == 1
        joint = (
            least_time_for_memory(*devices[0]) if alone else least_time_for_shared_channel(devices)
        )
        mem_lb = max(mem_lb, joint)
    return BoundParts(work_lb, fwd_lb, bwd_lb, mem_lb, drain_lb, fill_lb)


def _drain_bound(
    pb: Problem, s: int, room: float, B: list[float], below: list[float], head_work: float
) -> float | None:
    """Argument 6 for device ``s`` (module doc) at memory ``room``, after ``head_work`` (its
    argument-1 bound); None where it does not apply."""
    v, m = pb.num_chunks, pb.num_microbatches
    t_b, t_w, t_bw = pb.cost("t_b"), pb.cost("t_w"), pb.cost("t_bw")
    m_f, m_b = pb.cost("m_f"), pb.cost("m_b")
    groups = [pb.group_of(s, c) for c in range(v)]
    items: list[tuple[float, float]] = []  # (W-part bytes, W seconds) per chunk
    for c in range(v):
        wpart = float(m_f[s, c] + m_b[s, c])
        if float(t_w[s, c]) <= 0:
            continue
        if wpart <= 0:
            return None  # pending W's hold nothing: the limit does not cap them
        items.append((wpart, float(t_w[s, c])))
    ranked = sorted(items, key=lambda it: it[1] / it[0], reverse=True)

    def w_time(budget: float) -> float:
        """Most W seconds whose W-parts fit in ``budget`` (at most m - 1 per chunk)."""
        if len(ranked) == 1:
            wpart, tw = ranked[0]
            return max(0, min(m - 1, math.floor(budget / wpart + 1e-9))) * tw
        total = 0.0
        for wpart, tw in ranked:
            n = min(float(m), max(0.0, budget) / wpart)
            total += n * tw
            budget -= n * wpart
        return total

    busy = 0.0  # the most time d can spend on ops after t*
    for c, g in enumerate(groups):
        act = float(m_f[s, c])
        if act <= 0:
            return None
        own = max(float(t_b[s, c]) - B[g] + float(t_w[s, c]), float(t_bw[s, c]) - B[g])
        busy = max(busy, own + w_time(room - act))
    return head_work + max(0.0, min(below[g] for g in groups) - busy)


def _fill_idle(
    pb: Problem, s: int, room: float, EF: list[float], F: list[float], t1: float
) -> float:
    """Argument 7 for device ``s`` (module doc): seconds of ``[head, t1]`` it surely idles,
    where ``t1`` is the earliest any backward of it may start."""
    m, v = pb.num_microbatches, pb.num_chunks
    m_f, ob = pb.cost("m_f"), pb.cost("offload_bytes")
    chunks = sorted(range(v), key=lambda c: pb.group_of(s, c))  # a microbatch's order on s
    groups = [pb.group_of(s, c) for c in chunks]
    acts = [float(m_f[s, c]) for c in chunks]
    if min(acts) <= 0:
        return 0.0  # a forward that frees memory: the limit does not cap forwards
    head = min(EF[g] for g in groups)
    f_times = [F[g] for g in groups]
    window = t1 - head
    if window <= 0:
        return 0.0
    cap = room
    if pb.offload is not None:
        moves = [(pb.offload_time(s, c), float(ob[s, c])) for c in chunks if ob[s, c] > 0]
        if moves:
            t_off = min(t for t, _ in moves)
            if t_off <= 0:
                return 0.0
            # offloads end by e < t1 + the longest F, one at a time from the first F's end
            reach = t1 + max(f_times) - head - min(f_times)
            cap += max(0, math.floor(reach / t_off + 1e-9)) * max(x for _, x in moves)

    # a group's forwards run one at a time from its earliest start: few start before t1 (a
    # forward of no length is not capped by time)
    starts = [
        m if f <= 0 else max(0, min(m, math.ceil((t1 - EF[g]) / f - 1e-9)))
        for g, f in zip(groups, f_times, strict=True)
    ]

    def most(budget: float, act: float, limit: int) -> int:
        return max(0, min(limit, math.floor(budget / act + 1e-9)))

    if v == 1:
        work = most(cap, acts[0], starts[0]) * f_times[0]
    elif v == 2:
        # n_hi <= n_lo: the higher chunk's forward of a microbatch needs the lower one's first
        work = 0.0
        for n_lo in range(most(cap, acts[0], starts[0]) + 1):
            n_hi = most(cap - n_lo * acts[0], acts[1], min(n_lo, starts[1]))
            work = max(work, n_lo * f_times[0] + n_hi * f_times[1])
    else:  # fractional: a relaxation of the integer counts, ignoring the chunk order
        work, budget = 0.0, cap
        ranked = sorted(zip(acts, f_times, starts, strict=True), key=lambda x: x[1] / x[0])
        for act, f, n_max in reversed(ranked):
            n = min(float(n_max), budget / act)
            work += n * f
            budget -= n * act
    return max(0.0, window - work)


def least_time_for_memory(
    full: float, limit: float, options: list[tuple[float, float, int]]
) -> float:
    """Least T with ``full - savings <= limit * T`` for offloads whose copies fit in T.

    Offloading one activation saves ``saving`` resident byte-seconds and keeps its busier copy
    lane busy ``trip`` seconds (``lanes.lane_seconds``: offload plus reload on one lane, the
    longer of the two with duplex lanes), and every copy of a stage runs within the makespan on
    its lanes, so with fractional offload counts (a relaxation) the best savings within lane
    time T is a fractional knapsack: one device alone on its channel.
    """
    if not options:
        return full / limit
    return least_time_for_shared_channel([(full, limit, options)])


def least_time_for_shared_channel(
    devices: list[tuple[float, float, list[tuple[float, float, int]]]],
) -> float:
    """Least T at which the devices of one copy channel all fit their memory in T together.

    Each device is ``(full, limit, options)`` as in ``least_time_for_memory``. At a given T, a
    device falls ``full - limit * T`` byte-seconds short; the least channel time that saves them
    is a fractional knapsack taken by saving per channel second, best first. The channel runs one
    copy at a time within the makespan, so the devices' least times must sum to at most T. Both
    sides are monotone in T: bisect. With one device this is ``least_time_for_memory``.
    """
    ranked = [
        (full, limit, sorted(opts, key=lambda o: o[0] / o[1] if o[1] > 0 else math.inf)[::-1])
        for full, limit, opts in devices
    ]

    def channel_time(t: float) -> float:
        total = 0.0
        for full, limit, opts in ranked:
            short = full - limit * t
            for saving, trip, count in opts:
                if short <= 1e-14 * full:
                    break
                n = min(float(count), short / saving)
                total += n * trip
                short -= n * saving
            if short > 1e-14 * full:
                return math.inf  # even every offload leaves it short
        return total

    lo, hi = 0.0, max(full / limit for full, limit, _ in devices)
    for _ in range(60):
        mid = (lo + hi) / 2
        if channel_time(mid) <= mid:
            hi = mid
        else:
            lo = mid
    return lo
