"""The list scheduler's rules (``ListRule``), the portfolio of them worth trying on a problem
(``default_rules``), and what a rule's parameters come to per group before the greedy runs.

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

from dataclasses import dataclass

from ..schedule.problem import Problem
from .list_memory import EPS as _EPS


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


# what a rule's parameters come to per group, computed once before the greedy runs


def plan_triggers(
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


def group_chains(
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


def fitted_depths(
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


def reload_targets(g: int, lead: int, G: int) -> list[int]:
    """Groups whose reload starts when the B of group g starts."""
    if g == G - 1:
        # the top group triggers every group within ``lead`` of it
        return [x for x in range(max(0, G - 1 - lead), G - 1)]
    t = g - lead
    return [t] if t >= 0 else []
