"""Forking worker processes from a process that may hold torch.distributed objects.

A forked child inherits the parent's Python objects but none of its threads. When the child's
garbage collector later frees an inherited object whose destructor joins threads -- a gloo
``ProcessGroup`` left behind by an earlier run in the same process (a notebook, a test session)
joins its worker threads -- the join waits for threads that do not exist in the child, and the
rank hangs inside whatever op triggered the collection. ``inherited_objects_frozen`` moves every
object that exists at the fork into the collector's permanent generation (``gc.freeze``, as the
Python documentation recommends right before ``fork()``): the child never collects them; the
parent unfreezes once its children are started and collects them itself, where their threads are.

The same holds for OpenMP: GNU OpenMP (PyTorch's CPU thread pool on Linux) cannot start threads
in a process forked from one that already ran a parallel region -- the child's first parallel
op waits for the parent's pool, which it does not have. ``set_cpu_threads`` gives a forked CPU
rank one intra-op thread (an op then never enters a parallel region).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


@contextmanager
def inherited_objects_frozen() -> Iterator[None]:
    """Freeze the collector's view of every existing object while children are forked."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def set_cpu_threads(processes_per_machine: int, *, forked: bool) -> int:
    """The intra-op threads of a CPU rank; returns the count set (0: left as it is).

    Ranks on one machine share its cores: without ``OMP_NUM_THREADS``, each gets its share
    (oversubscribed threads make every op slower than profiled; torchrun sets
    ``OMP_NUM_THREADS=1`` for the same reason). A forked rank gets one thread whatever the
    environment says (see the module doc: its launcher process may have used OpenMP, e.g. an
    earlier run in a notebook, and more threads would hang its first parallel op).
    """
    import torch

    share = max(1, (os.cpu_count() or 1) // max(1, processes_per_machine))
    if forked:
        if share > 1 or os.environ.get("OMP_NUM_THREADS", "1") != "1":
            log.info(
                "optpipe: ranks started by fork compute with one CPU thread each (OpenMP cannot "
                "start threads in a forked process); start_method='popen' or 'spawn' uses more"
            )
        torch.set_num_threads(1)
        return 1
    if "OMP_NUM_THREADS" in os.environ:
        return 0
    torch.set_num_threads(share)
    return share
