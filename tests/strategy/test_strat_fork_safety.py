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

import pytest
import torch.distributed as dist

from optpipe_lightning.strategy.fork_safety import inherited_objects_frozen

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
