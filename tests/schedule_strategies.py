"""Hypothesis strategies for problems and arbitrary valid schedules (shared by schedule tests)."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from optpipe_lightning.schedule import Action, Problem


@st.composite
def problems(
    draw: st.DrawFn,
    *,
    max_stages: int = 4,
    max_mb: int = 6,
    offload: bool | None = None,
    limit: bool | None = None,
) -> Problem:
    p = draw(st.integers(1, max_stages))
    m = draw(st.integers(1, max_mb))
    v = draw(st.sampled_from([1, 1, 2]))
    placement = draw(st.sampled_from(["interleaved", "vshape"]))
    times = st.floats(0.1, 3.0, allow_nan=False).map(lambda x: round(x, 3))

    def per_stage(strat: st.SearchStrategy[float]) -> float | list[float] | list[list[float]]:
        kind = draw(st.integers(0, 2))
        if kind == 0:
            return draw(strat)
        if kind == 1:
            return [draw(strat) for _ in range(p)]
        return [[draw(strat) for _ in range(v)] for _ in range(p)]

    mf = draw(st.floats(1.0, 4.0).map(lambda x: round(x, 2)))
    frac = draw(st.floats(0.0, 1.0).map(lambda x: round(x, 2)))
    use_off = draw(st.booleans()) if offload is None else offload
    use_lim = draw(st.booleans()) if limit is None else limit
    return Problem(
        num_stages=p,
        num_microbatches=m,
        num_chunks=v,
        placement=placement,
        t_f=per_stage(times),
        t_b=per_stage(times),
        t_w=per_stage(st.floats(0.0, 2.0).map(lambda x: round(x, 3))),
        t_bw=per_stage(times) if draw(st.integers(0, 3)) == 0 else None,
        t_comm=draw(st.sampled_from([0.0, 0.05, 0.3])),
        m_f=mf,
        m_b=-mf * frac,
        m_w=-mf * (1 - frac),
        memory_limit=draw(st.floats(mf, mf * m * v * 1.5)) if use_lim else None,
        offload={
            "bytes": mf * draw(st.sampled_from([0.5, 1.0])),
            "d2h_bandwidth": draw(st.sampled_from([0.5, 2.0, 10.0])),
            "h2d_bandwidth": draw(st.sampled_from([0.5, 2.0, 10.0])),
            "channel_groups": [[0, 1]] if p >= 2 and draw(st.booleans()) else [],
            "duplex": draw(st.booleans()),
        }
        if use_off
        else None,
    )


def random_valid_actions(problem: Problem, seed: int) -> list[list[Action]]:
    """A random schedule without deadlock: any global topological order projected onto stages."""
    rng = random.Random(seed)
    p, m, v = problem.num_stages, problem.num_microbatches, problem.num_chunks
    G = p * v
    fused = rng.random() < 0.5
    rows: list[list[Action]] = [[] for _ in range(p)]
    done: set[tuple[str, int, int]] = set()  # (kind, group, mb)
    pending_reload: list[tuple[int, int, int]] = []
    offloaded: set[tuple[int, int]] = set()
    frontier = {("F", 0, j) for j in range(m)}
    ops_total = G * m * (2 if fused else 3)
    placed = 0
    while placed < ops_total:
        ready = sorted(frontier)
        kind, g, j = ready[rng.randrange(len(ready))]
        frontier.discard((kind, g, j))
        s, c = problem.group_table[g]
        if kind == "B" and (g, j) in offloaded and (s, c, j) in pending_reload:
            rows[s].append(Action("RELOAD", j, c))
            pending_reload.remove((s, c, j))
        rows[s].append(Action("BW" if (kind == "B" and fused) else kind, j, c))
        done.add((kind, g, j))
        placed += 1
        if kind == "F":
            if problem.offload is not None and g < G - 1 and rng.random() < 0.5:
                rows[s].append(Action("OFFLOAD", j, c))
                offloaded.add((g, j))
                pending_reload.append((s, c, j))
            if g + 1 < G:
                frontier.add(("F", g + 1, j))
            else:
                frontier.add(("B", g, j))
        elif kind == "B":
            if not fused:
                frontier.add(("W", g, j))
            if g > 0:
                frontier.add(("B", g - 1, j))
        # sometimes issue a pending reload early, while compute goes on
        if pending_reload and rng.random() < 0.3:
            s2, c2, j2 = pending_reload.pop(rng.randrange(len(pending_reload)))
            rows[s2].append(Action("RELOAD", j2, c2))
    return rows
