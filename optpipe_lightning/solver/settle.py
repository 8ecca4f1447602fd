"""The settle point in the CP-SAT models: which ops may settle an offload.

The simulator (``schedule.sim_memory``) frees an offload's bytes at its *settle point*: the start
of the first compute action of its stage that starts at or after the copy ends, or of a RELOAD of
its stage listed after it that starts then (a reload settles the offloads whose room it takes);
an offload settled by a compute action frees after the allocations of that instant (the F that
ends there allocated while the copy was still held).

The models give each offload a free time ``tau`` and a choice among the ops that may settle it
(``settle_candidates``): its own RELOAD (``tau`` = its start, where its allocation nets out the
free), another RELOAD of its stage (``tau`` >= that reload's start, the reload at or after the
copy's end), or a compute op of its stage (``tau`` >= its start plus one tick, the op at or after
the copy's end: one tick later, so that what the instant allocates counts before the free, as in
the simulator). ``tau`` <= its own reload's start. Freeing at *any* such op is sound (the true
settle point, the first of them, comes no later; a reload listed after the offload, because the
schedule lists transfers of a stage by start), and exact where the solver picks the first:
it does wherever the memory binds. The own reload always qualifies, so every offload has a
choice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ortools.sat.python import cp_model

from .ticks import OpKey

Act = tuple[int, int, int]  # (stage, chunk, microbatch)


def settle_candidates(
    act: Act, keys: Iterable[OpKey], group: dict[tuple[int, int], int], window: int | None
) -> list[OpKey]:
    """The ops of ``act``'s stage other than its own RELOAD that may start between its
    offload's copy end and its own reload's start (so may settle it): compute ops (F, B, W)
    not ordered before its F ends or after its B starts by the dependencies and the models'
    microbatch order per kind and chunk, and other RELOADs of its stage; with ``window``, only
    microbatches within that distance. ``group``: each (stage, chunk)'s layer group."""
    s, c, j = act
    g = group[(s, c)]
    out: list[OpKey] = []
    for key in keys:
        op, s2, c2, j2 = key
        if s2 != s or (s2, c2, j2) == act or op == "OFFLOAD":
            continue
        if window is not None and abs(j2 - j) > window:
            continue
        if op == "RELOAD":
            out.append(key)
            continue
        g2 = group[(s2, c2)]
        if op == "F":
            # F(g2, j2) ends before F(g, j) ends where g2 <= g and j2 <= j (chain and order)
            if g2 <= g and j2 <= j:
                continue
        else:  # B, W: B(g2, j2) starts after B(g, j) starts where g2 <= g and j2 >= j
            if g2 <= g and j2 >= j:
                continue
        out.append(key)
    return out


def first_settle(
    act: Act,
    ready: int,
    own_reload: int,
    starts: dict[OpKey, int],
    candidates: list[OpKey],
) -> tuple[OpKey | None, int]:
    """For a hint: the candidate the simulator settles ``act``'s offload at (``None``: its own
    reload) and the model's free time for it, from tick starts (``ready``: the copy's end)."""
    best: tuple[int, OpKey | None] = (own_reload, None)
    for key in candidates:
        st = starts.get(key)
        if st is None or st < ready:
            continue
        at = st if key[0] == "RELOAD" else st + 1
        if at < best[0]:
            best = (at, key)
    return best[1], best[0]


def add_settle_choice(
    md: cp_model.CpModel,
    tau: cp_model.IntVar,
    offloaded: cp_model.IntVar,
    ready: cp_model.LinearExprT,
    own_reload: cp_model.LinearExprT,
    options: Sequence[tuple[cp_model.LinearExprT, bool, Sequence[cp_model.LiteralT]]],
) -> list[cp_model.IntVar]:
    """``tau`` (the free time of an offload whose copy ends at ``ready``) at its own reload's
    start, or at one of ``options``: (start, is a reload, literals it needs); a reload's start
    or a compute op's start plus one tick, the op starting at or after ``ready``. Returns the
    choice literals, the own reload's first (module doc)."""
    own = md.new_bool_var("")
    md.add(tau == own_reload).only_enforce_if(own)
    md.add(tau <= own_reload)  # 0 when not offloaded (its reload's start is then pinned to 0)
    md.add(tau >= ready).only_enforce_if(offloaded)  # implied; it helps the reservoir propagate
    md.add(tau == 0).only_enforce_if(~offloaded)
    lits = [own]
    for start, is_reload, needs in options:
        lit = md.new_bool_var("")
        md.add(start >= ready).only_enforce_if(lit)
        md.add(tau >= start + (0 if is_reload else 1)).only_enforce_if(lit)
        for x in needs:
            md.add_implication(lit, x)
        lits.append(lit)
    md.add_bool_or(lits).only_enforce_if(offloaded)
    return lits
