# SPDX-License-Identifier: Apache-2.0
"""Own processes are known by pid, never by name (issue 40, item 8): a copy
of /bin/yes named ``jitterscope:up``, run by nobody on the CPU a victim
needs, is a neighbour to move in the alert, not "the cost of watching"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jitterscope.collector.agent import Stamp
from jitterscope.collector.probes.interface import ProbeContext
from jitterscope.collector.probes.runq import RunqSignal
from jitterscope.common.settings import Settings
from jitterscope.streams.rules.runq import ProcessView, runq_starvation
from jitterscope.workload import last_cpu
from tests.nobody import as_nobody, copy_named

pytestmark = pytest.mark.bpf

MS = 1_000_000
VICTIM = """
import time
while True:
    end = time.monotonic() + 0.001
    while time.monotonic() < end:
        pass
    time.sleep(0.002)
"""


def pinned(argv: list[str], cpu: int, nobody: bool = True) -> subprocess.Popen:
    argv = ["taskset", "-c", str(cpu), *argv]
    return subprocess.Popen(as_nobody(argv) if nobody else argv, cwd="/",
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _schedstat(pid: int) -> str:
    """on-CPU ns, run-queue wait ns, timeslices: what the kernel saw, for a failure's message"""
    try:
        return Path(f"/proc/{pid}/schedstat").read_text().strip()
    except OSError as exc:
        return str(exc)


def test_a_process_named_like_jitterscope_is_named_as_the_neighbour_it_is():
    cpu = last_cpu()
    yes = copy_named("/bin/yes", "jitterscope:up")
    published = []
    context = ProbeContext(
        settings=Settings(host="t", runq_threshold_ms=1, runq_stacks=False), stamp=Stamp("t"),
        publish=published.append, describe_process=lambda pid: None, comm_of=lambda pid: "",
        targets=set(), own={os.getpid(): "collector"})
    signal = RunqSignal()
    procs = []
    try:
        signal.open(context)  # compiled before the load starts
        # the victim is root's: only the attacker is nobody (and the venv's Python may
        # sit under a 0700 /root that nobody cannot reach)
        victim = pinned([sys.executable, "-I", "-c", VICTIM], cpu, nobody=False)
        procs.append(victim)
        signal.set_targets({victim.pid}, {})
        hogs = [pinned([str(yes)], cpu) for _ in range(3)]  # as the demo: 3 hogs make waits likely under EEVDF
        procs += hogs
        hog_pids = {h.pid for h in hogs}  # taskset and setpriv exec: the pid is the hog's own

        def behind_a_hog():
            return [e for e in published if getattr(e, "suspect_pid", 0) in hog_pids]

        def behind_the_named_hog():
            # a wait before the hog's exec names taskset or setpriv: wait for one after it
            return [e for e in behind_a_hog() if e.suspect_comm == "?jitterscope:up"]

        deadline = time.monotonic() + 60  # a busy 2-core box: generous
        while time.monotonic() < deadline and not behind_the_named_hog():
            signal.poll(100)
        seen = behind_the_named_hog()
        assert seen, (f"the victim never waited >= 1 ms behind a hog named jitterscope:up ({len(published)} "
                      f"records, behind a hog: {[e.suspect_comm for e in behind_a_hog()]}; victim "
                      f"{'running' if victim.poll() is None else f'exited {victim.returncode}'}, schedstat "
                      f"{_schedstat(victim.pid)}, hogs {[_schedstat(h.pid) for h in hogs]})")
        assert not any(e.suspect_own for e in behind_a_hog()), "a foreign process was taken for jitterscope's own"
    finally:
        for p in procs:
            p.kill()
            p.wait()
        signal.close()
        shutil.rmtree(yes.parent, ignore_errors=True)
    event = max(seen, key=lambda e: e.wait_ns)
    assert event.suspect_own is False and event.suspect_comm == "?jitterscope:up"
    alert = runq_starvation(event, 1 * MS, ProcessView("python3", [cpu]), list(range(os.cpu_count())),
                            time.time_ns())
    print(alert.summary, "|", alert.remedy)
    assert f"?jitterscope:up (pid {event.suspect_pid}) held it" in alert.summary
    assert "jitterscope itself" not in alert.summary and "cost of watching" not in alert.remedy
    if os.cpu_count() > 1:
        assert alert.remedy.startswith("move ?jitterscope:up off the inference CPUs: taskset -apc")
