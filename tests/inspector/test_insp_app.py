"""Every inspector page under Streamlit's AppTest, on a database the tests fill.

Charts are checked through their Vega-Lite specs and the Arrow data the page sends, not only for
existence; database states (missing, empty, not a database, written while open) must give a
clear message and never an exception.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import streamlit as st
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

import optpipe_lightning.inspector as inspector
from optpipe_lightning.inspector import data
from optpipe_lightning.inspector.chrome_trace import chrome_trace
from optpipe_lightning.inspector.demo import demo_problem, fill_database, greedy_schedule
from optpipe_lightning.profiles_db import open_database, repository

APP = Path(inspector.__file__).parent / "app.py"


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('insp') / 'optpipe.db'}"
    return url, fill_database(url, running_solver=True, baselines=False)


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


def test_overview_counts_and_search(filled: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    url, _ = filled
    at = page(url, "overview", monkeypatch)
    assert metrics(at) == {
        "problems": "2",
        "schedules": "4",
        "profiles": "1",
        "solver runs": "2",
        "training runs": "1",
    }
    tables = {tuple(df.value.columns[:3]): df.value for df in at.dataframe}
    sched = next(v for k, v in tables.items() if k == ("id", "problem_hash", "generator"))
    assert sorted(sched["generator"]) == ["greedy", "greedy", "greedy-offload", "greedy-offload"]
    assert all(link.startswith("timeline?schedule=") for link in sched["timeline"])
    hw = next(v for v in tables.values() if "interconnect" in v.columns)
    assert hw.iloc[0]["device"] == "NVIDIA H100 80GB HBM3" and hw.iloc[0]["memory_GiB"] == 80.0
    at.text_input[0].input("greedy-offload").run()
    sched = next(df.value for df in at.dataframe if "generator" in df.value.columns)
    assert sorted(sched["generator"]) == ["greedy-offload", "greedy-offload"]


def test_timeline_page(filled: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    url, info = filled
    sid = info["schedules"][(2, "greedy-offload")]
    at = page(url, "timeline", monkeypatch, schedule=str(sid))
    pb_sc = repository_schedule(url, sid)
    ev = pb_sc.evaluation
    assert metrics(at)["makespan"] == f"{ev.makespan * 1e3:.3f} ms"
    assert metrics(at)["offloaded activations"] == str(ev.num_offloaded)
    ((spec, (df,)),) = vega(at)
    bars = spec["layer"][0]
    assert bars["mark"]["type"] == "bar"
    assert bars["encoding"]["yOffset"]["field"] == "lane"
    assert spec["params"][0]["bind"] == "scales"
    assert len(df) == sum(len(r) for r in pb_sc.actions) == 4 * 8 * 2 * 3 + 2 * 4 * 4 * 2
    assert df["end_ms"].max() == pytest.approx(ev.makespan * 1e3)
    assert (df[df.kind.isin(["OFFLOAD", "RELOAD"])]["lane"] == "copy").all()
    idle = next(d.value for d in at.dataframe if "idle_ms" in d.value.columns)
    assert len(idle) == 4 and (idle["idle_ms"] >= 0).all()
    # the picker and the query parameter follow each other
    other = info["schedules"][(1, "greedy")]
    at.selectbox(key="schedule").select(other).run()
    assert at.query_params["schedule"] == str(other)
    ((_, (df2,)),) = vega(at)
    assert len(df2) == 4 * 8 * 3 and set(df2["lane"]) == {"compute"}


def repository_schedule(url: str, sid: int):  # type: ignore[no-untyped-def]
    with open_database(url, read_only=True) as db, db.session() as s:
        return repository.get_schedule(s, sid)


def test_memory_page(filled: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    url, info = filled
    sid = info["schedules"][(1, "greedy-offload")]
    at = page(url, "memory", monkeypatch, schedule=str(sid))
    sc = repository_schedule(url, sid)
    assert sc.problem is not None
    (mem_spec, (mem,)), (_peak_spec, (peaks,)) = vega(at)
    assert mem_spec["facet"]["field"] == "device"
    assert [layer["mark"]["type"] for layer in mem_spec["spec"]["layer"]] == [
        "line",
        "rule",
        "point",
        "point",
    ]
    assert set(mem["series"]) == {"on device", "offloaded"}
    scale = 2**30  # GiB for this problem
    got = mem[mem.is_peak].sort_values("device")["value"].to_numpy() * scale
    assert got == pytest.approx(sc.evaluation.peak_memory)
    assert peaks["peak"].to_numpy() * scale == pytest.approx(sc.evaluation.peak_memory)
    assert peaks["limit"].to_numpy() * scale == pytest.approx(sc.problem.memory_limits())
    assert metrics(at)["fits the memory limit"] == ("yes" if sc.evaluation.feasible else "no")


def test_solver_page_finished_run(filled: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    url, info = filled
    at = page(url, "solver", monkeypatch, run=str(info["solver_run"]))
    m = metrics(at)
    events = info["solver_events"]
    assert m["status"] == "feasible"
    assert m["incumbent"] == f"{events[-1][1] * 1e3:.3f} ms"
    assert m["gap"] == f"{(events[-1][1] - events[-1][2]) / events[-1][1]:.1%}"
    ((spec, dfs),) = vega(at)
    prog = dfs[0]
    assert len(prog) == 2 * len(events)
    inc = prog[prog.series == "incumbent"].sort_values("wall_time")
    assert inc["makespan_ms"].to_numpy() == pytest.approx([e[1] * 1e3 for e in events])
    assert spec["layer"][0]["mark"]["interpolate"] == "step-after"
    if len(dfs) > 1:  # baselines generated for the problem (when the generators are installed)
        from optpipe_lightning.schedule.baselines import BASELINE_NAMES

        assert set(dfs[1]["baseline"]) <= set(BASELINE_NAMES)


def test_solver_page_running_run_shows_new_events(
    filled: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, info = filled
    run = info["running_solver_run"]
    at = page(url, "solver", monkeypatch, run=str(run))
    assert metrics(at)["status"] == "running"
    assert any("refreshes every" in c.value for c in at.caption)
    ((_, dfs),) = vega(at)
    assert len(dfs[0]) == 2
    with open_database(url) as db, db.session() as s:
        from optpipe_lightning.profiles_db.models import SolverEventRecord

        s.add(SolverEventRecord(run_id=run, wall_time=1.7, makespan=0.52, bound=0.49))
    at.run()  # what the fragment's timer does in the browser
    ((_, dfs),) = vega(at)
    assert len(dfs[0]) == 4
    assert metrics(at)["incumbent"] == "520.000 ms"


def test_compare_page(filled: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    url, info = filled
    pb_hash = info["problems"][1]
    at = page(url, "compare", monkeypatch, problem=pb_hash)
    summary = next(d.value for d in at.dataframe if "makespan_ms" in d.value.columns)
    ids = [info["schedules"][(2, n)] for n in ("greedy", "greedy-offload")]
    expect = {i: repository_schedule(url, i).evaluation for i in ids}
    assert len(summary) == 2
    for row in summary.itertuples():
        sid = int(row.schedule.split()[0][1:])
        assert row.makespan_ms == pytest.approx(expect[sid].makespan * 1e3)
        assert row.num_offloaded == expect[sid].num_offloaded
    (_, (bars,)), (spec, (stacked,)) = vega(at)
    assert len(bars) == 2
    assert spec["facet"]["row"]["field"] == "schedule"
    assert stacked.groupby("schedule").size().sort_values().tolist() == [
        4 * 8 * 2 * 3,
        4 * 8 * 2 * 3 + 64,
    ]
    at.multiselect(key="compare_ids").unselect(ids[0]).run()
    assert at.query_params["schedules"] == str(ids[1])
    (_, (stacked,)) = vega(at)[1]
    assert stacked["schedule"].nunique() == 1


def test_profiles_page(filled: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    url, _ = filled
    at = page(url, "profiles", monkeypatch)
    m = metrics(at)
    assert m["p2p time"] == "0.600 ms" and m["device → host"] == "20.0 GB/s"
    (spec, (times,)), (_, (acts,)) = vega(at)
    assert len(times) == 4 * 3
    f0 = times[(times.stage == 0) & (times.kind == "F")].iloc[0]
    assert (f0.min_ms, f0.mean_ms, f0.max_ms) == pytest.approx((0.93 * 18, 18, 1.12 * 18))
    assert [
        layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"]
        for layer in spec["spec"]["layer"]
    ] == ["rule", "bar", "tick"]
    assert acts[acts.what == "activation"]["value"].to_numpy() * 2**30 == pytest.approx([2.0e9] * 4)


def test_training_page(filled: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    url, _ = filled
    at = page(url, "training", monkeypatch)
    assert metrics(at)["steps"] == "12" and metrics(at)["schedule switches"] == "1"
    (_spec, dfs), (_, (mem,)) = vega(at)
    steps, switches = dfs
    assert len(steps) == 24
    pred = steps[steps.series == "predicted"].sort_values("step")["seconds"].to_numpy()
    assert pred == pytest.approx([0.53] * 6 + [0.50] * 6)
    assert switches["step"].tolist() == [6]
    assert len(mem) == 12 * 4
    assert mem[(mem.step == 0) & (mem["rank"] == 0)]["value"].iloc[0] * 2**30 == pytest.approx(8e9)


def test_export_page_and_trace(filled: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    url, info = filled
    sid = info["schedules"][(2, "greedy-offload")]
    at = page(url, "export", monkeypatch, schedule=str(sid))
    assert len(at.get("download_button")) == 2
    text = data.trace_json(url, sid)
    sc = repository_schedule(url, sid)
    assert json.loads(text) == json.loads(json.dumps(chrome_trace(None, sc)))
    assert metrics(at)["trace size"] == f"{len(text) / 1e6:.2f} MB"


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
    pb = demo_problem(2, 3)
    with open_database(url) as db, db.session() as s:
        repository.store_schedule(s, greedy_schedule(pb), source="demo")
    writer = sqlite3.connect(tmp_path / "live.db", timeout=1)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("DELETE FROM schedules")  # uncommitted
    try:
        at = page(url, "timeline", monkeypatch)
        ((_, (df,)),) = vega(at)
        assert len(df) == 2 * 3 * 3
    finally:
        writer.rollback()
        writer.close()


def test_large_timeline_is_drawn_a_window_at_a_time(
    filled: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optpipe_lightning.inspector import ui

    monkeypatch.setattr(ui, "MAX_BARS", 40)
    url, info = filled
    sid = info["schedules"][(1, "greedy")]
    at = page(url, "timeline", monkeypatch, schedule=str(sid))
    (slider,) = at.slider
    lo, hi = slider.value
    assert lo == 0.0 and 0 < hi < float(metrics(at)["makespan"].split()[0])
    ((_, (df,)),) = vega(at)
    assert 0 < len(df) < 4 * 8 * 3
    assert df["end_ms"].max() <= hi + 1e-9
    slider.set_range(hi, 2 * hi).run()
    ((_, (df2,)),) = vega(at)
    assert df2["start_ms"].min() >= hi - 1e-9


def test_a_schedule_that_cannot_be_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored schedule that deadlocks: every page says so instead of drawing (or failing)."""
    from optpipe_lightning.schedule import Action, Schedule

    url = f"sqlite:///{tmp_path / 'bad.db'}"
    pb = demo_problem(2, 2)
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
        repository.store_schedule(s, greedy_schedule(pb), source="test")
    for name, query in (
        ("timeline", {"schedule": str(sid)}),
        ("memory", {"schedule": str(sid)}),
        ("export", {"schedule": str(sid)}),
        ("compare", {"problem": pb.hash, "schedules": f"{sid},{sid + 1}"}),
    ):
        at = page(url, name, monkeypatch, **query)
        if name == "compare":
            ((_, (bars,)), (_, (stacked,))) = vega(at)
            assert bars["makespan_ms"].isna().sum() == 1  # the stuck one has no makespan
            assert set(stacked["schedule"]) == {f"#{sid + 1} greedy"}
        else:
            assert not vega(at)
            assert any("deadlock" in w.value for w in at.warning) or any(
                "cannot be timed" in i.value or "deadlock" in i.value for i in at.info
            ), name
