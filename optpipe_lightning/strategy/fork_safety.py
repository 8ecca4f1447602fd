"""Forking worker processes from a process that may hold torch.distributed objects.

A forked child inherits the parent's Python objects but none of its threads. When the child's
garbage collector later frees an inherited object whose destructor joins threads -- a gloo
``ProcessGroup`` left behind by an earlier run in the same process (a notebook, a test session)
joins its worker threads -- the join waits for threads that do not exist in the child, and the
rank hangs inside whatever op triggered the collection. ``inherited_objects_frozen`` moves every
object that exists at the fork into the collector's permanent generation (``gc.freeze``, as the
Python documentation recommends right before ``fork()``): the child never collects them; the
parent unfreezes once its children are started and collects them itself, where their threads are.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def inherited_objects_frozen() -> Iterator[None]:
    """Freeze the collector's view of every existing object while children are forked."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
