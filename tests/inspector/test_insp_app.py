"""Every inspector page under Streamlit's AppTest, on the demo database (real baselines, solver
runs and a recorded training run).

Charts are checked through their Vega-Lite specs and the Arrow data the page sends, not only for
existence; database states (missing, empty, not a database, written while open) must give a
clear message and never an exception.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import streamlit as st
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

import optpipe_lightning.inspector as inspector
from optpipe_lightning.cli.demo import DemoDatabase
from optpipe_lightning.inspector import data
from optpipe_lightning.inspector.chrome_trace import chrome_trace
from optpipe_lightning.profiles_db import open_database, repository
from optpipe_lightning.profiles_db.models import SolverEventRecord, SolverRunRecord
from optpipe_lightning.schedule import Problem, Schedule
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.schedule.units import format_seconds

APP = Path(inspector.__file__).parent / "app.py"
# a schedule that offloads whatever the machine's speed (a baseline, not a timed solve)
OFFLOADING = ("gpt-4x8x2", "adaoffload")


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    st.cache_data.clear()
    st.cache_resource.clear()
    yield


def page(url: str, name: str, monkeypatch: pytest.MonkeyPatch, **query: str) -> AppTest:
    monkeypatch.setenv("OPTPIPE_DB_URL", url)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    if name != "overview" or query:
        for k, v in query.items():
            at.query_params[k] = v
        at.switch_page(f"views/{name}.py").run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def vega(at: AppTest) -> list[tuple[dict, list[pd.DataFrame]]]:
    """(spec, datasets as DataFrames) of every Vega-Lite chart on the page."""
    els = at.get("vega_lite_chart") or at.get("arrow_vega_lite_chart")
    out = []
    for el in els:
        spec = json.loads(el.proto.spec)
        dfs = [convert_arrow_bytes_to_pandas_df(d.data.data) for d in el.proto.datasets]
        out.append((spec, dfs))
    return out


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def stored(url: str, sid: int) -> Schedule:
    with open_database(url, read_only=True) as db, db.session() as s:
        return repository.get_schedule(s, sid)


def table_with(at: AppTest, column: str) -> pd.DataFrame:
    return next(df.value for df in at.dataframe if column in df.value.columns)


def test_overview_lists_and_searches(demo_db: DemoDatabase, monkeypatch: Any) -> None:
    at = page(demo_db.url, "overview", monkeypatch)
    assert metrics(at) == {
        "problems": "3",
        "schedules": str(len(set(demo_db.schedules.values()))),
        "profiles": "2",
        "solver runs": "4",
        "training runs": "1",
    }
    sched = table_with(at, "produced_by")
    assert all(link.startswith("timeline?schedule=") for link in sched["timeline"])
    # the two solves of one problem are told apart by what produced them
    solved = sched[sched["produced_by"].str.startswith("optpipe")]["produced_by"].tolist()
    assert any("heuristic" in x for x in solved) and any("cpsat" in x for x in solved)
    problems = table_with(at, "label")
    assert "4x8 · limit 2 B · offload" in set(problems["label"])  # no name: its shape
    # issue 27: any query crashed once a training run was stored
    for query in ("finished", "cpsat", demo_db.problems["gpt-4x8"][:6], "gpt-1.5b", "zzz"):
        at.text_input[0].input(query).run()
        assert not at.exception, query
    at.text_input[0].input("finished").run()
    assert len(table_with(at, "steps")) == 1  # the training run, by its status
    at.text_input[0].input("cpsat").run()
    assert table_with(at, "produced_by")["produced_by"].str.contains("cpsat").all()
    at.text_input[0].input("zzz").run()
    assert any("nothing matches" in c.value for c in at.caption)


def test_timeline_page(demo_db: DemoDatabase, monkeypatch: Any) -> None:
    sid = demo_db.schedules[OFFLOADING]
    at = page(demo_db.url, "timeline", monkeypatch, schedule=str(sid))
    sc = stored(demo_db.url, sid)
    ev = sc.evaluation
    assert metrics(at)["makespan"] == format_seconds(ev.makespan)
    assert metrics(at)["offloaded activations"] == str(ev.num_offloaded)
    (busy_spec, (busy,)), (spec, (df, *_)) = vega(at)
    assert busy_spec["mark"]["type"] == "rect" and busy["device"].nunique() == 4
    bars = spec["layer"][0]
    assert bars["mark"]["type"] == "bar"
    assert bars["encoding"]["yOffset"]["field"] == "lane"
    assert spec["params"][0]["bind"] == "scales"
    assert len(df) == sum(len(r) for r in sc.actions)
    assert df["end"].max() == pytest.approx(ev.makespan * 1e3)  # in ms
    assert set(df[df.kind == "OFFLOAD"]["lane"]) == {"device → host"}
    assert set(df[df.kind == "RELOAD"]["lane"]) == {"host → device"}
    assert "BW" not in bars["encoding"]["color"]["scale"]["domain"]
    # idle time per stage: a Markdown table (no data grid on the first view)
    (idle,) = [m.value for m in at.markdown if m.value.startswith("| stage | busy (ms)")]
    rows = idle.splitlines()[2:]
    assert len(rows) == 4 and all(r.endswith("% |") for r in rows)
    assert not [df for df in at.dataframe if "idle_fraction" in df.value.columns]
    # the picker and the query parameter follow each other
    other = demo_db.schedules[("gpt-4x8", "1f1b")]
    at.selectbox(key="schedule").select(other).run()
    assert at.query_params["schedule"] == str(other)
    (_, (df2, *_)) = vega(at)[1]
    assert set(df2["lane"]) == {"compute"}


def test_unit_costs_read_in_seconds(demo_db: DemoDatabase, monkeypatch: Any) -> None:
    sid = demo_db.schedules[("unit-4x8", "optpipe/auto")]
    at = page(demo_db.url, "timeline", monkeypatch, schedule=str(sid))
    assert metrics(at)["makespan"].endswith(" s")
    (_, (df, *_)) = vega(at)[1]
    assert vega(at)[1][0]["layer"][0]["encoding"]["x"]["title"] == "time (s)"
    assert df["end"].max() == pytest.approx(stored(demo_db.url, sid).evaluation.makespan)


def test_unknown_ids_get_a_notice(demo_db: DemoDatabase, monkeypatch: Any) -> None:
    at = page(demo_db.url, "timeline", monkeypatch, schedule="9999")
    (warning,) = at.warning
    assert "No schedule '9999' in this database" in warning.value
    assert at.query_params["schedule"] != "9999"
    at = page(demo_db.url, "compare", monkeypatch, problem="feedbeef")
    assert "No problem 'feedbeef'" in at.warning[0].value


def test_memory_page(demo_db: DemoDatabase, monkeypatch: Any) -> None:
    sid = demo_db.schedules[OFFLOADING]
    at = page(demo_db.url, "memory", monkeypatch, schedule=str(sid))
    sc = stored(demo_db.url, sid)
    assert sc.problem is not None
    (mem_spec, (mem,)), (_peak_spec, (peaks,)) = vega(at)
    assert mem_spec["facet"]["field"] == "device"
    assert [layer["mark"]["type"] for layer in mem_spec["spec"]["layer"]] == [
        "rule",
        "line",
        "point",
        "point",
    ]
    assert set(mem["series"]) == {"on device", "offloaded"}
    got = mem[mem.is_peak].sort_values("device")["value"].to_numpy() * 1e9  # GB
    assert got == pytest.approx(sc.evaluation.peak_memory)
    assert peaks["peak"].to_numpy() * 1e9 == pytest.approx(sc.evaluation.peak_memory)
    assert peaks["limit"].to_numpy() * 1e9 == pytest.approx(sc.problem.memory_limits())
    m = metrics(at)
    assert m["highest peak"].endswith(" GB") and "e+" not in m["highest peak"]
    assert m["fits the memory limit"] == ("yes" if sc.evaluation.feasible else "no")


def test_solver_page_draws_the_whole_solve(demo_db: DemoDatabase, monkeypatch: Any) -> None:
    run_id = demo_db.solver_runs[("gpt-4x8", "cpsat")]
    at = page(demo_db.url, "solver", monkeypatch, run=str(run_id))
    with open_database(demo_db.url, read_only=True) as db, db.session() as s:
        run = repository.get_solver_run(s, run_id)
        events = repository.solver_events(s, run_id)
    m = metrics(at)
    assert m["status"] == run.status
    assert m["incumbent"] == format_seconds(run.makespan)
    assert m["solved in (limit 1 s)"] == format_seconds(
        (run.finished_at - run.started_at).total_seconds()
    )
    ((spec, dfs),) = vega(at)
    prog = dfs[0]
    end = (run.finished_at - run.started_at).total_seconds()
    # the lines reach the end of the solve, not the last improvement
    assert prog["wall_time"].max() == pytest.approx(max(end, events[-1].wall_time))
    x_domain = spec["layer"][0]["encoding"]["x"]["scale"]["domain"]
    assert x_domain[1] >= max(end, 1.0)  # the time limit (1 s) is on the axis too
    lo, hi = spec["layer"][0]["encoding"]["y"]["scale"]["domain"]
    values = prog["makespan"]
    assert lo <= values.min() and hi >= values.max()
    assert hi - lo < 1.3 * (values.max() - values.min()) + 1e-9  # baselines never stretch it
    texts = [d for d in dfs if "what" in d.columns]
    assert any("end" in w for d in texts for w in d["what"])


def _start_run(url: str, problem_hash: str, *, ago: float, limit: float = 60.0) -> int:
    with open_database(url) as db, db.session() as s:
        run = repository.start_solver_run(s, problem_hash, "cpsat", {"time_limit": limit})
        rec = s.get(SolverRunRecord, run)
        rec.started_at = data.now() - timedelta(seconds=ago)
        s.add(SolverEventRecord(run_id=run, wall_time=0.3, makespan=0.9, bound=0.4))
    return run


def test_solver_page_follows_a_running_solve(writable_copy: DemoDatabase, monkeypatch: Any) -> None:
    url = writable_copy.url
    run = _start_run(url, writable_copy.problems["gpt-4x8"], ago=12.0)
    at = page(url, "solver", monkeypatch)  # no link: the running run comes first
    assert at.selectbox(key="solver_run").value == run
    m = metrics(at)
    assert m["status"] == "running"
    assert float(m["solving for (limit 60 s)"].split()[0]) >= 12.0
    assert any("follows the run" in c.value for c in at.caption)
    ((_, dfs),) = vega(at)
    assert dfs[0]["wall_time"].max() >= 12.0  # drawn to "now"
    assert len(dfs[0]) == 4  # incumbent and bound: the event and "now"
    with open_database(url) as db, db.session() as s:
        s.add(SolverEventRecord(run_id=run, wall_time=1.7, makespan=0.7, bound=0.45))
    st.cache_data.clear()
    at.run()  # what the fragment's timer does in the browser
    assert metrics(at)["incumbent"] == "700.000 ms"
    # a solve started while the page is open: listed and announced on the next refresh
    later = _start_run(url, writable_copy.problems["gpt-4x8x2"], ago=1.0)
    st.cache_data.clear()  # the list's cache (1 s) has expired by the next refresh
    at.run()
    options = at.selectbox(key="solver_run").options
    assert any(o.startswith(f"run #{later} · running") for o in options)
    assert at.selectbox(key="solver_run").value == run  # the page stays on what it showed
    assert any(f"run #{later}" in i.value for i in at.info)
    # following it
    at.button(key=f"follow_{later}").click().run()
    assert at.query_params["run"] == str(later)


def test_compare_page(demo_db: DemoDatabase, monkeypatch: Any) -> None:
    pb_hash = demo_db.problems["gpt-4x8"]
    at = page(demo_db.url, "compare", monkeypatch, problem=pb_hash)
    summary = table_with(at, "makespan_display")
    # the default shows the fastest schedules that fit the limit
    assert summary["feasible"].all()
    ids = [int(s.split()[0][1:]) for s in summary["schedule"]]
    for sid, row in zip(ids, summary.itertuples(), strict=True):
        ev = stored(demo_db.url, sid).evaluation
        assert row.makespan_display == pytest.approx(ev.makespan * 1e3)  # ms
        assert row.num_offloaded == ev.num_offloaded
    assert "e+" not in json.dumps(summary["peak_display"].tolist())
    (_, (bars,)), (spec, (stacked,)) = vega(at)
    assert len(bars) == len(ids)
    assert spec["facet"]["row"]["field"] == "schedule"
    at.multiselect(key="compare_ids").unselect(ids[0]).run()
    assert at.query_params["schedules"] == ",".join(str(i) for i in ids[1:])
    (_, (stacked,)) = vega(at)[1]
    assert stacked["schedule"].nunique() == len(ids) - 1


def test_profiles_page(demo_db: DemoDatabase, monkeypatch: Any) -> None:
    at = page(demo_db.url, "profiles", monkeypatch)
    m = metrics(at)
    assert m["p2p time"] == "600.000 µs" and m["device → host"] == "25.0 GB/s"
    (spec, (times,)), (_, (acts,)) = vega(at)
    assert spec["spec"]["layer"][0]["mark"]["type"] == "bar"
    assert len(times) == times["stage"].nunique() * times["chunk"].nunique() * 3
    assert acts[acts.what == "activation"]["value"].max() > 0


def test_training_page(demo_db: DemoDatabase, monkeypatch: Any) -> None:
    at = page(demo_db.url, "training", monkeypatch)
    m = metrics(at)
    assert m["status"] == "finished" and m["steps"] == "40"
    assert float(m["last train loss"]) > 0 and float(m["samples / s (median)"]) > 0
    assert len(vega(at)) == 4  # loss, throughput, step time, memory
    (_, loss_dfs), (_, (thr,)), (_, st_dfs), (_, mem_dfs) = vega(at)
    loss = loss_dfs[0]
    assert set(loss["series"]) == {"train", "validation"}
    assert (loss["series"] == "validation").sum() == 4
    assert len(thr) == 40
    steps = st_dfs[0]
    assert set(steps["series"]) == {"measured", "predicted"}
    events = next(d for d in st_dfs if "kind" in d.columns)
    assert events["kind"].tolist() == ["switch", "calibration", "switch"]
    assert events["short"].iloc[2].startswith("→ #") and "%" in events["short"].iloc[2]
    limits = next(d for d in mem_dfs if "limit" in d.columns)
    peaks = next(d for d in mem_dfs if "rank" in d.columns and "value" in d.columns)
    assert (peaks["value"] <= limits["limit"].max() + 1e-9).all()
    table = table_with(at, "reason")
    assert len(table) == 3 and table["gain"].iloc[1:].str.contains("→").all()
    assert table["gain"].iloc[0].endswith("per step")  # the first schedule: no "before"


def test_export_page_and_trace(demo_db: DemoDatabase, monkeypatch: Any) -> None:
    sid = demo_db.schedules[OFFLOADING]
    at = page(demo_db.url, "export", monkeypatch, schedule=str(sid))
    assert len(at.get("download_button")) == 2
    text = data.trace_json(demo_db.url, sid)
    sc = stored(demo_db.url, sid)
    assert json.loads(text) == json.loads(json.dumps(chrome_trace(None, sc)))
    assert metrics(at)["trace size"].endswith("kB")


@pytest.mark.parametrize(
    "name",
    ["overview", "timeline", "memory", "solver", "compare", "profiles", "training", "export"],
)
def test_missing_database_is_a_message(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = page(f"sqlite:///{tmp_path / 'nope.db'}", name, monkeypatch)
    assert [e.value for e in at.error] == [
        f"no database at {tmp_path / 'nope.db'} to read: check --db, or create it with a run that writes"
    ]


def test_empty_and_foreign_databases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    open_database(url).close()
    for name in ("overview", "timeline", "solver", "profiles", "training"):
        at = page(url, name, monkeypatch)
        assert len(at.info) == 1
        assert "yet" in at.info[0].value or "empty" in at.info[0].value
        assert not vega(at)
    junk = tmp_path / "junk.db"
    junk.write_text("not a database")
    at = page(f"sqlite:///{junk}", "timeline", monkeypatch)
    assert "is not an SQLite database file" in at.error[0].value


def test_database_being_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer in the middle of a transaction: the page shows the committed rows, no error."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    pb = Problem(num_stages=2, num_microbatches=3, t_f=1.0, t_b=1.0, t_w=1.0)
    with open_database(url) as db, db.session() as s:
        repository.store_schedule(s, generate("zb-h1", pb), source="baseline")
    writer = sqlite3.connect(tmp_path / "live.db", timeout=1)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("DELETE FROM schedules")  # uncommitted
    try:
        at = page(url, "timeline", monkeypatch)
        (_, (df,)) = vega(at)[1]
        assert len(df) == 2 * 3 * 3
    finally:
        writer.rollback()
        writer.close()


def test_large_timeline_is_drawn_a_window_at_a_time(
    demo_db: DemoDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optpipe_lightning.inspector import ui

    monkeypatch.setattr(ui, "MAX_BARS", 40)
    sid = demo_db.schedules[("gpt-4x8", "1f1b")]
    at = page(demo_db.url, "timeline", monkeypatch, schedule=str(sid))
    (slider,) = at.slider
    lo, hi = slider.value
    makespan_ms = stored(demo_db.url, sid).evaluation.makespan * 1e3
    assert lo == 0.0 and 0 < hi < makespan_ms
    (_, (df,)) = vega(at)[1]
    assert 0 < len(df) < 4 * 8 * 2
    assert df["end"].max() <= hi + 1e-9
    slider.set_range(hi, min(2 * hi, makespan_ms)).run()
    (_, (df2,)) = vega(at)[1]
    assert df2["start"].min() >= hi - 1e-9


def test_a_schedule_that_cannot_be_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored schedule that deadlocks: every page says so instead of drawing (or failing)."""
    from optpipe_lightning.schedule import Action

    url = f"sqlite:///{tmp_path / 'bad.db'}"
    pb = Problem(num_stages=2, num_microbatches=2, t_f=1.0, t_b=1.0, t_w=1.0)
    order = [
        Action("F", 0),
        Action("B", 0),
        Action("W", 0),
        Action("F", 1),
        Action("B", 1),
        Action("W", 1),
    ]
    stuck = Schedule(
        problem_hash=pb.hash, generator="stuck", actions=[[order[1], *order[:1], *order[2:]], order]
    )
    with open_database(url) as db, db.session() as s:
        sid = repository.store_schedule(s, stuck, problem=pb, source="test")
        repository.store_schedule(s, generate("1f1b", pb), source="baseline")
    for name, query in (
        ("timeline", {"schedule": str(sid)}),
        ("memory", {"schedule": str(sid)}),
        ("export", {"schedule": str(sid)}),
        ("compare", {"problem": pb.hash, "schedules": f"{sid},{sid + 1}"}),
    ):
        at = page(url, name, monkeypatch, **query)
        if name == "compare":
            ((_, (bars,)), (_, (stacked,))) = vega(at)
            assert bars["makespan_display"].isna().sum() == 1  # the stuck one has no makespan
            assert set(stacked["schedule"]) == {f"#{sid + 1} 1f1b"}
        else:
            assert not vega(at)
            assert any("deadlock" in w.value for w in at.warning) or any(
                "cannot be timed" in i.value or "deadlock" in i.value for i in at.info
            ), name
