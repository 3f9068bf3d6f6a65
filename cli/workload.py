# SPDX-License-Identifier: Apache-2.0
"""A reproducible run-queue starvation: a latency-sensitive "victim" thread
doing short CPU bursts and sleeps, pinned to one CPU with CPU hogs.

Used by `jitterscope demo`, the end-to-end tests and the benchmarks, so all
three see the same scenario. Each process names itself (prctl PR_SET_NAME) so
filters and assertions can find it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

VICTIM_COMM = "jsvictim"
HOG_COMM = "jshog"

_SET_NAME = "import ctypes; ctypes.CDLL(None).prctl(15, {name!r}.encode(), 0, 0, 0)\n"

_VICTIM = _SET_NAME + """
import time
time.sleep({delay})
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    x = 0
    for i in range(20000):  # ~1 ms of CPU
        x += i
    time.sleep(0.002)
"""

_HOG = _SET_NAME + """
import time
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    pass
"""


@contextmanager
def _named_python(name: str):
    """A path to this Python whose file name is ``name``: the kernel names a
    process after the file it executes, so it is ``name`` from its first
    instruction. (prctl alone renames it only once the interpreter has
    started, and the waits of that start-up, tens of milliseconds beside the
    hogs, were alerts about "python".) The children use the standard library
    only, so the link need not find a virtual environment.

    The link lives in a folder made for this one start (``mkdtemp``: new,
    0700, ours, an unguessable name), never a fixed name under /tmp, where
    another user could make the folder first and swap the link between a
    check and the exec (root then ran their script). It is removed once the
    child has executed it."""
    folder = tempfile.mkdtemp(prefix="jitterscope-names-")
    try:
        link = os.path.join(folder, name)
        os.symlink(os.path.realpath(sys.executable), link)
        yield link
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _spawn(code: str, cpu: int, name: str) -> subprocess.Popen:
    # Popen returns once the child has executed the link (or failed to), so the folder may go then.
    # -I and cwd "/": with -c the caller's directory comes first on sys.path, where a planted ctypes.py
    # would run instead; PYTHON* variables are ignored too (the children need none)
    with _named_python(name) as python:
        return subprocess.Popen([python, "-I", "-c", code], cwd="/",
                                preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))


def last_cpu() -> int:
    """The host's last online CPU (not this process's: tests keep themselves off it)."""
    from jitterscope.collector.hostinfo import online_cpus

    return online_cpus()[-1]


@contextmanager
def cpu_hogs(seconds: float, cpu: int | None = None, count: int = 3):
    """CPU hogs on one CPU; yields once they are running under their own name."""
    cpu = last_cpu() if cpu is None else cpu
    procs = [_spawn(_HOG.format(name=HOG_COMM, seconds=seconds + 1), cpu, HOG_COMM) for _ in range(count)]
    try:
        for proc in procs:  # interpreter start-up runs as "python": wait for the rename
            while _comm(proc.pid) not in (HOG_COMM, None):
                time.sleep(0.01)
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


@contextmanager
def starvation(seconds: float, cpu: int | None = None, hogs: int = 3, delay: float = 1.0,
               name: str = VICTIM_COMM):
    """Yields the victim's Popen; ``hogs=0`` is the unloaded control."""
    cpu = last_cpu() if cpu is None else cpu
    victim = _spawn(_VICTIM.format(name=name, delay=delay, seconds=seconds), cpu, name)
    hog_procs = [_spawn(_HOG.format(name=HOG_COMM, seconds=seconds + delay), cpu, HOG_COMM) for _ in range(hogs)]
    try:
        yield victim
        victim.wait(seconds + delay + 30)
    finally:
        for proc in [victim, *hog_procs]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
