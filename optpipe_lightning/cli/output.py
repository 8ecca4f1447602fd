"""What the ``optpipe`` schedule commands print: the consoles, a schedule's row (the JSON
contract's fields, DESIGN.md), the problem summary and the table that shows the rows.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # the schedule model loads when a command runs, not for --help
    from ..schedule import Problem, Schedule

out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, soft_wrap=True)  # a note is one line, never wrapped


@contextmanager
def status_line(first: str, *, enabled: bool) -> Iterator[Callable[[str], None]]:
    """A spinner with one line of what runs now, on stderr when it is a terminal (else
    nothing: piped and ``--json`` output stay as they were); yields the line's setter."""
    console = sys.modules[__name__].err  # (looked up now: tests swap the console)
    if not enabled or not console.is_terminal:
        yield lambda _text: None
        return
    from rich.live import Live
    from rich.spinner import Spinner

    spinner = Spinner("dots", first)
    with Live(spinner, console=console, transient=True, refresh_per_second=12.5) as live:

        def say(text: str) -> None:
            spinner.update(text=text)
            live.refresh()  # every step shows, however fast the steps come

        yield say


def fmt_time(seconds: float | None) -> str:
    from ..schedule.units import format_seconds

    return format_seconds(seconds)


def fmt_bytes(x: float | None) -> str:
    from ..schedule.units import format_bytes

    return format_bytes(x, none="∞")


def schedule_row(
    name: str,
    schedule: Schedule,
    bound: float | None,
    solve_seconds: float | None = None,
) -> dict[str, Any]:
    ev = schedule.evaluation
    assert ev is not None
    v, placement = chunking_of(schedule)
    return {
        "name": name,
        "makespan": ev.makespan,
        "bubble_rate": ev.bubble_rate,
        "stage_span_bubble_rate": ev.stage_span_bubble_rate,
        "peak_memory": ev.peak_memory,
        "memory_limit": ev.memory_limit,
        "feasible": ev.feasible,
        "num_offloaded": ev.num_offloaded,
        "solve_seconds": solve_seconds,
        "lower_bound": bound,
        "num_chunks": v,
        "placement": placement,
    }


def chunking_of(schedule: Schedule) -> tuple[int, str]:
    """The chunk count and placement a schedule was built for (recorded, else its problem's,
    else what its actions use)."""
    if schedule.num_chunks is not None:
        return schedule.num_chunks, schedule.placement or "interleaved"
    if schedule.problem is not None:
        from ..schedule.chunking import own_chunking

        return own_chunking(schedule.problem)
    v = 1 + max((a.chunk for row in schedule.actions for a in row), default=0)
    return v, "interleaved"


def problem_summary(problem: Problem, bound: float) -> dict[str, Any]:
    return {
        "hash": problem.hash,
        "name": problem.name,
        "num_stages": problem.num_stages,
        "num_microbatches": problem.num_microbatches,
        "num_chunks": problem.num_chunks,
        "placement": problem.placement,
        "memory_limit": problem.memory_limits(),
        "offload": problem.offload is not None,
        "lower_bound": bound,
    }


def print_table(
    problem: Problem,
    rows: list[dict[str, Any]],
    skipped: dict[str, str],
    interrupted: str | None = None,
) -> None:
    """The rows as a table; ``interrupted`` (the signal's name) marks a run cut short."""
    chunked = problem.layers() is not None
    title = (
        f"problem {problem.hash}: p={problem.num_stages} m={problem.num_microbatches} "
        f"v={problem.num_chunks}" + (f" ({problem.placement})" if problem.num_chunks > 1 else "")
    )
    if problem.name:
        out.print(f"[dim]{problem.name}[/]", highlight=False)
    if interrupted:
        title += f" (interrupted by {interrupted})"
    table = Table(title=title, title_justify="left")
    for col, justify in (
        ("schedule", "left"),
        *((("chunks", "left"),) if chunked else ()),
        ("makespan", "right"),
        ("bubble", "right"),
        ("stage-span", "right"),
        ("peak / limit", "right"),
        ("fits", "center"),
        ("offloads", "right"),
        ("solve", "right"),
        ("bound", "right"),
    ):
        table.add_column(col, justify=justify)
    best = min((r["makespan"] for r in rows if r["feasible"]), default=None)
    for r in rows:
        peaks, limits = r["peak_memory"], r["memory_limit"]
        i = max(range(len(peaks)), key=lambda k: peaks[k]) if peaks else 0
        lim = limits[i] if limits else None
        peak = f"{fmt_bytes(peaks[i])} / {fmt_bytes(lim)}" if peaks else "-"
        mk = fmt_time(r["makespan"])
        if best is not None and r["feasible"] and r["makespan"] == best:
            mk = f"[bold green]{mk}[/]"
        chunks = f"v={r['num_chunks']}" + (f" {r['placement']}" if r["num_chunks"] > 1 else "")
        table.add_row(
            r["name"],
            *((chunks,) if chunked else ()),
            mk,
            "-" if r["bubble_rate"] is None else f"{r['bubble_rate']:.4f}",
            "-" if r["stage_span_bubble_rate"] is None else f"{r['stage_span_bubble_rate']:.4f}",
            peak,
            "[green]yes[/]" if r["feasible"] else "[red]no[/]",
            str(r["num_offloaded"]),
            fmt_time(r["solve_seconds"]),
            fmt_time(r["lower_bound"]),
        )
    out.print(table)
    for name, reason in skipped.items():
        out.print(f"[dim]{name}: not applicable: {reason}[/]")
    if interrupted:
        out.print(f"interrupted by {interrupted}: the rows are the best found before it")
