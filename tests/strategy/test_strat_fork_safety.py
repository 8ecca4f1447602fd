"""A forked rank never runs the destructor of a process group its parent left behind.

The last CI on record hung in two ``dist`` tests: a forked rank's garbage collector freed a gloo
``ProcessGroup`` inherited from the test session (an earlier in-process test's), whose destructor
joins worker threads a forked child does not have (``py-spy``: ``gc_collect_main`` ->
``~ProcessGroupGloo`` -> ``std::thread::join``). Without the freeze, the child below hangs
(checked by hand: still alive after 8 s, every time).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from pathlib import Path

import pytest
import torch.distributed as dist

from optpipe_lightning.strategy.runtime.fork_safety import inherited_objects_frozen

pytestmark = pytest.mark.dist


def _leave_a_process_group_behind() -> None:
    pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
    box: dict[str, object] = {"pg": pg}
    box["self"] = box  # a cycle: only the collector frees it


def _collect() -> None:
    gc.collect()


def test_a_forked_child_never_collects_an_inherited_process_group() -> None:
    was_enabled = gc.isenabled()
    gc.disable()  # the group stays garbage until the fork
    try:
        _leave_a_process_group_behind()
        child = multiprocessing.get_context("fork").Process(target=_collect)
        with inherited_objects_frozen():
            child.start()
        child.join(60)
        hung = child.is_alive()
        if hung:
            child.kill()
            child.join()
        assert not hung and child.exitcode == 0
    finally:
        if was_enabled:
            gc.enable()
        gc.collect()  # here, in the parent, the group's threads exist: it goes
    assert not gc.isenabled() or gc.get_freeze_count() == 0


def test_a_taken_rendezvous_port_is_replaced_and_a_free_one_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lightning keeps its first ``MASTER_PORT`` for every later run of the process; the store
    of an earlier in-process run can still listen there (the ranks then read stale addresses)."""
    import socket

    from lightning.fabric.plugins.environments import LightningEnvironment

    from optpipe_lightning.strategy.lightning.launcher import free_main_port

    with socket.socket() as stale:
        stale.bind(("127.0.0.1", 0))
        stale.listen()
        taken = stale.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(taken))
        monkeypatch.setenv("LOCAL_RANK", "0")  # left behind by that run too
        env = LightningEnvironment()
        free_main_port(env)
        assert env.main_port != taken and os.environ["MASTER_PORT"] == str(env.main_port)
    kept = LightningEnvironment()
    port = kept.main_port  # now free: the stale socket is closed
    free_main_port(kept)
    assert kept.main_port == port


def test_forked_cpu_ranks_compute_with_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from optpipe_lightning.strategy.runtime.fork_safety import set_cpu_threads

    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "8")  # e.g. left by an earlier launch
        assert set_cpu_threads(1, forked=True) == 1 and torch.get_num_threads() == 1
        assert set_cpu_threads(1, forked=False) == 0  # the user's setting, not forked: kept
        monkeypatch.delenv("OMP_NUM_THREADS")
        share = max(1, (os.cpu_count() or 1) // 2)
        assert set_cpu_threads(2, forked=False) == share == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


AFTER_AN_IN_PROCESS_RUN = """
import sys
sys.path.insert(0, {tests!r})
from pipelined_lm import LM, trainer
from optpipe_lightning.strategy import OptPipeStrategy

def fit(devices, start_method):
    strategy = OptPipeStrategy(num_stages=devices, num_microbatches=2, schedule="1f1b",
                               start_method=start_method, online_resolve=False,
                               use_database=False)
    trainer(devices, strategy, max_epochs=1, limit_train_batches=3).fit(LM())

fit(1, "popen")  # in this process: leaves MASTER_PORT, LOCAL_RANK, OMP_NUM_THREADS, its store
fit(2, "fork")   # the ranks used to meet that store, or hang in their first parallel op
print("both fits done")
"""


def test_a_fork_launch_after_an_in_process_run_of_the_same_process(tmp_path: Path) -> None:
    """What a notebook does: one run in the process, then a forked one (in a fresh interpreter
    with a deadline: the failure modes were a hang and a stale rendezvous)."""
    import subprocess
    import sys

    script = AFTER_AN_IN_PROCESS_RUN.format(tests=str(Path(__file__).parent))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "LOCAL_RANK")}
    env.pop("OMP_NUM_THREADS", None)
    try:
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode()
        raise AssertionError(f"still running after 240 s:\n{out[-3000:]}") from None
    assert done.returncode == 0 and "both fits done" in done.stdout, done.stderr[-3000:]
