# SPDX-License-Identifier: Apache-2.0
"""The frame-pointer workload of the stacks tests (fphog.c): built with gcc
once per session, run as CPU hogs and a CPU-hungry victim on one CPU."""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

SOURCE = Path(__file__).with_name("fphog.c")
HOG_FUNCTION = "jitterscope_hog_spin"
VICTIM_FUNCTION = "jitterscope_victim_work"
HOG_COMM, VICTIM_COMM = "fphog", "fpvictim"


def build(directory: Path) -> Path:
    gcc = shutil.which("gcc")
    assert gcc, "gcc is needed to build the frame-pointer hog: apt-get install gcc (make setup)"
    binary = directory / "fphog"
    subprocess.run([gcc, "-O1", "-fno-omit-frame-pointer", "-o", str(binary), str(SOURCE)], check=True)
    return binary


@contextmanager
def contention(binary: Path, cpu: int, seconds: float, hogs: int = 2):
    """``hogs`` hogs and one victim pinned to ``cpu``; yields the victim's Popen."""
    def pin():
        os.sched_setaffinity(0, {cpu})

    procs = [subprocess.Popen([str(binary), "hog", str(seconds + 1)], preexec_fn=pin) for _ in range(hogs)]
    victim = subprocess.Popen([str(binary), "victim", str(seconds)], preexec_fn=pin)
    try:
        yield victim
    finally:
        for proc in [victim, *procs]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
