"""Work functions for the dead-worker tests, importable by spawned workers."""
from __future__ import annotations

import gc
import os
import signal
import struct


def half_message_then_die() -> None:
    """What a worker killed while sending a large result leaves behind: the header of a message
    and part of its body in the pool's shared result pipe; then SIGKILL."""
    from multiprocessing.queues import SimpleQueue
    for q in [o for o in gc.get_objects() if isinstance(o, SimpleQueue)]:
        os.write(q._writer.fileno(), struct.pack("!i", 1_000_000) + b"\x80" * 100)
    os.kill(os.getpid(), signal.SIGKILL)


def sweep_work(point, trace):
    """distributed.sweep's unit of work: the doomed point dies mid-send, the others sleep briefly."""
    import time
    if "doomed" in point.label:
        half_message_then_die()
    time.sleep(0.2)
    return {}


def task(x):
    if x == "doomed":
        half_message_then_die()
    return x
