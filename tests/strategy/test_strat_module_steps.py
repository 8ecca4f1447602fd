"""A module written for one device, pipelined: its own steps and metrics equal one device's.

Every logged metric (after each training batch, each validation epoch with the sanity check and
each training epoch), what ``validate``, ``test`` and ``predict`` return, and the parameters left
in the user's process after ``fit`` equal a one-device run of the same module (fp32, 1e-5), for
1F1B, ZB-H1, ZB-V, interleaved 1F1B with 4 chunks per device and the solver with offload.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from pipelined_lm import LM, launch, run_session

import optpipe_lightning  # noqa: F401  (registers "optpipe")
from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy

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
    # the strategy's metrics: the schedule that ran, no switch since; unit costs predict nothing
    assert got["optpipe"] == {
        "optpipe/schedule_switches": 1.0,
        f"optpipe/schedule/{opts['schedule']}": 1.0,
    }


def _stored_profile(url: str, microbatches: int, memory: float) -> None:
    """A profile of LM on 2 stages in the database, as the strategy would look it up: unit-ish
    costs, 1000 bytes per activation, copies far faster than compute."""
    from optpipe_lightning.profiles_db import open_database
    from optpipe_lightning.profiles_db import repository as repo
    from optpipe_lightning.schedule.profile import OpStats, Profile, StageProfile
    from optpipe_lightning.strategy.planning.partition import balanced_partition
    from optpipe_lightning.strategy.scheduling.profiler import (
        hardware_fingerprint,
        model_fingerprint,
    )

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
        model=model_fingerprint("LM", layers, 2, 2, 1, partition, placement="interleaved"),
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
        # 1F1B keeps 2 activations on stage 0 (2000 bytes): 1500 fit only with offload (one
        # chunk per device, set: with more the solver could fit without)
        strategy = pipelined(
            schedule="optimal",
            num_chunks=1,
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
    predicted = got["switches"][0]["predicted_seconds"]
    assert got["optpipe"]["optpipe/predicted_step_s"] == pytest.approx(predicted)


@pytest.mark.timeout(300)  # Lightning's own fork launcher has no deadline of its own
def test_fork_launch_leaves_the_trained_model_and_checkpoints_resume_on_four_stages(
    one_device: dict[str, Any], tmp_path: Path
) -> None:
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
    from pipelined_lm import MetricsRecorder, trainer

    # Lightning's fork launcher: the workers are not the user's process
    model = LM()
    ckpts = ModelCheckpoint(
        dirpath=tmp_path, filename="{epoch}-{val_loss:.5f}", monitor="val_loss", save_top_k=-1
    )
    stop = EarlyStopping(monitor="val_acc", mode="max", patience=5)
    tr = trainer(
        2,
        pipelined(schedule="1f1b", start_method="fork"),
        callbacks=[ckpts, stop],
        enable_checkpointing=True,
    )
    tr.fit(model)
    for k, v in one_device["state"].items():  # the whole trained model, here
        torch.testing.assert_close(model.state_dict()[k], v, atol=TOL, rtol=0)
    # ModelCheckpoint saw one device's val_loss after each epoch
    # (the recorded validations: the sanity check, two epochs, then trainer.validate)
    val_losses = [row["val_loss"] for where, row in one_device["rows"] if where == "val"][1:3]
    names = sorted(p.name for p in tmp_path.glob("epoch=*.ckpt"))
    assert names == [f"epoch={e}-val_loss={v:.5f}.ckpt" for e, v in enumerate(val_losses)]
    # the first epoch's checkpoint resumes on 4 stages with another schedule: the second epoch
    # ends where one device does
    first = str(tmp_path / names[0])
    out = tmp_path / "resumed.pt"

    def resume() -> None:
        model = LM()
        rec = MetricsRecorder()
        tr = trainer(4, pipelined(schedule="zb-h1"), callbacks=[rec])
        tr.fit(model, ckpt_path=first)
        if tr.global_rank == 0:
            torch.save({"rows": rec.rows, "state": model.state_dict()}, out)

    assert launch(4, resume, tmp_path / "resume") == ["", "", "", ""]
    got = torch.load(out, weights_only=False)
    for k, v in one_device["state"].items():
        torch.testing.assert_close(got["state"][k], v, atol=TOL, rtol=0)
    want = [row for where, row in one_device["rows"] if where == "epoch"][-1]  # after epoch 2
    assert got["rows"][-1][0] == "epoch"
    for k, v in got["rows"][-1][1].items():
        assert v == pytest.approx(want[k], abs=TOL), k


def test_two_nodes_through_torchrun_train_as_one_device(
    one_device: dict[str, Any], tmp_path: Path
) -> None:
    """``Trainer(num_nodes=2, devices=2)`` started by two torchrun "nodes" on 127.0.0.1."""
    import subprocess
    import sys

    from pipelined_lm import free_port

    script = Path(__file__).with_name("two_node_train.py")
    port = free_port()
    out = tmp_path / "two_nodes.pt"
    # the checkout first on the path: the nodes import this tree even where the installed
    # package points elsewhere
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    # each node's output to a file: a pipe read only after the other node ends fills (64 kB of
    # warnings) and blocks its writer inside a collective -- both nodes then wait for ever
    outs = [tmp_path / f"node{node}.log" for node in range(2)]
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=2",
                f"--node-rank={node}",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                str(script),
                str(out),
            ],
            env=env,
            stdout=outs[node].open("w"),
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in range(2)
    ]
    try:
        for proc in nodes:
            proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        for p in nodes:
            p.kill()
        raise AssertionError(
            "two-node run still going after 300 s:\n"
            + "\n".join(o.read_text()[-3000:] for o in outs if o.exists())
        ) from None
    logs = [o.read_text() for o in outs]
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(x[-3000:] for x in logs)
    got = torch.load(out, weights_only=False)
    assert got["world"] == {"nodes": 2, "devices": 2, "world_size": 4, "num_stages": 4}
    for k, v in one_device["state"].items():
        torch.testing.assert_close(got["state"][k], v, atol=TOL, rtol=0)
    fit_rows = one_device["rows"][:-1]  # (its last row is trainer.validate's)
    for (where, row), (_, want) in zip(got["rows"], fit_rows, strict=True):
        for k, v in want.items():
            assert row[k] == pytest.approx(v, abs=TOL), (where, k)


def test_a_schedule_for_another_chunking_runs_on_the_partition_it_implies(
    one_device: dict[str, Any], tmp_path: Path
) -> None:
    """The schedule chosen (here by ``schedule_source``, as the solver may) has 4 chunks per
    device in V placement: each device keeps its 4 layers, one per chunk, zig-zag."""
    from optpipe_lightning.schedule import Problem
    from optpipe_lightning.schedule.baselines import generate

    def four_chunks(problem: Problem) -> Any:
        chunked = Problem(
            num_stages=2, num_microbatches=4, num_chunks=4, placement="vshape", t_f=1, t_b=1, t_w=1
        )
        return generate("gpipe", chunked).model_copy(update={"problem": chunked})

    out = tmp_path / "pp.pt"
    partitions = tmp_path / "partition.txt"

    def after_fit(tr: Any) -> None:
        partitions.write_text(str(tr.strategy.scheduler.partition))

    strategy = pipelined(schedule="1f1b", schedule_source=four_chunks)
    assert launch(2, lambda: run_session(2, strategy, out, after_fit), tmp_path) == ["", ""]
    got = torch.load(out, weights_only=False)
    assert_same_as_one_device(got, one_device)
    assert partitions.read_text() == str([1] * 8)
    assert [s["to"] for s in got["switches"]] == ["gpipe"]
