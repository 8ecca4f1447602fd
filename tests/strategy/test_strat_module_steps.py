"""A module written for one device, pipelined: its own steps and metrics equal one device's.

Every logged metric (after each training batch, each validation epoch with the sanity check and
each training epoch), what ``validate``, ``test`` and ``predict`` return, and the parameters left
in the user's process after ``fit`` equal a one-device run of the same module (fp32, 1e-5), for
1F1B, ZB-H1, ZB-V, interleaved 1F1B with 4 chunks per device and the solver with offload.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pipelined_lm import LM, launch, run_session

import optpipe_lightning  # noqa: F401  (registers "optpipe")
from optpipe_lightning.strategy.strategy import OptPipeStrategy

pytestmark = pytest.mark.dist

TOL = 1e-5


@pytest.fixture(scope="module")
def one_device(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("one_device")
    out = work / "ref.pt"
    assert launch(1, lambda: run_session(1, "auto", out), work) == [""]
    return dict(torch.load(out, weights_only=False))


def assert_same_as_one_device(got: dict[str, Any], ref: dict[str, Any]) -> None:
    assert [w for w, _ in got["rows"]] == [w for w, _ in ref["rows"]]
    for (where, row), (_, want) in zip(got["rows"], ref["rows"], strict=True):
        assert set(row) == set(want), where
        for k, v in want.items():
            assert row[k] == pytest.approx(v, abs=TOL), (where, k)
    for call in ("val", "test"):
        assert got[call][0].keys() == ref[call][0].keys()
        for k, v in ref[call][0].items():
            assert got[call][0][k] == pytest.approx(v, abs=TOL), (call, k)
    assert [p.shape for p in got["pred"]] == [p.shape for p in ref["pred"]]
    for p, q in zip(got["pred"], ref["pred"], strict=True):
        assert torch.equal(p, q)
    assert set(got["state"]) == set(ref["state"])
    for k, v in ref["state"].items():
        torch.testing.assert_close(got["state"][k], v, atol=TOL, rtol=0)


def pipelined(**opts: Any) -> OptPipeStrategy:
    opts.setdefault("profile_steps", 0)
    opts.setdefault("use_database", False)
    return OptPipeStrategy(num_microbatches=4, online_resolve=False, **opts)


@pytest.mark.parametrize(
    "opts",
    [
        {"schedule": "1f1b"},
        {"schedule": "zb-h1"},
        {"schedule": "zbv"},
        {"schedule": "interleaved-1f1b", "num_chunks": 4},
    ],
    ids=["1f1b", "zb-h1", "zbv", "interleaved-4-chunks"],
)
def test_module_steps_equal_one_device(
    opts: dict[str, Any], one_device: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "pp.pt"
    errors = launch(2, lambda: run_session(2, pipelined(**opts), out), tmp_path)
    assert errors == ["", ""]
    got = torch.load(out, weights_only=False)
    assert_same_as_one_device(got, one_device)
    assert [s["to"] for s in got["switches"]] == [opts["schedule"]]


def _stored_profile(url: str, microbatches: int, memory: float) -> None:
    """A profile of LM on 2 stages in the database, as the strategy would look it up: unit-ish
    costs, 1000 bytes per activation, copies far faster than compute."""
    from optpipe_lightning.profiles_db import open_database
    from optpipe_lightning.profiles_db import repository as repo
    from optpipe_lightning.schedule.profile import OpStats, Profile, StageProfile
    from optpipe_lightning.strategy.partition import balanced_partition
    from optpipe_lightning.strategy.profiler import hardware_fingerprint, model_fingerprint

    layers = LM().configure_pipeline().layers
    costs = [1.0 + sum(p.numel() for p in layer.parameters()) for layer in layers]
    partition = balanced_partition(costs, 2)
    ms = OpStats(mean=1e-3)
    stages = [
        StageProfile(stage=s, f=ms, b=ms, w=ms, activation_bytes=memory, weight_grad_bytes=memory)
        for s in range(2)
    ]
    profile = Profile(
        hardware=hardware_fingerprint(torch.device("cpu"), 2, "gloo"),
        model=model_fingerprint("LM", layers, 2, 2, 1, partition),
        num_microbatches=microbatches,
        stages=stages,
        p2p_seconds=1e-4,
        d2h_bandwidth=1e8,
        h2d_bandwidth=1e8,
    )
    db = open_database(url)
    with db.session() as s:
        repo.store_profile(s, profile)
    db.close()


def test_module_steps_equal_one_device_with_the_solver_offloading(
    one_device: dict[str, Any], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'optpipe.db'}"
    _stored_profile(url, microbatches=4, memory=1000.0)
    out = tmp_path / "pp.pt"
    offloads = tmp_path / "offloads.txt"

    def count_offloads(tr: Any) -> None:
        engine = tr.strategy.scheduler.engine
        if tr.global_rank == 0:
            moved = [h for h in engine.offload.history if h[0] == "OFFLOAD" and h[2] > 0]
            offloads.write_text(str(len(moved)))

    def session() -> None:
        # 1F1B keeps 2 activations on stage 0 (2000 bytes): 1500 fit only with offload
        strategy = pipelined(
            schedule="optimal",
            memory_limit=1500.0,
            offload_min_bytes=0,
            database=url,
            use_database=True,
            profile_steps=1,
            solver_time_limit=3.0,
        )
        run_session(2, strategy, out, after_fit=count_offloads)

    assert launch(2, session, tmp_path) == ["", ""]
    got = torch.load(out, weights_only=False)
    assert_same_as_one_device(got, one_device)
    assert [(s["reason"], s["predicted_seconds"] is not None) for s in got["switches"]] == [
        ("stored profile", True)
    ]
    assert int(offloads.read_text()) > 0  # the last step moved activations off stage 0
