# SPDX-License-Identifier: Apache-2.0
"""`fix` for a memory evictor, end to end (issue 35): a stand-in server (its
weights in the page cache) and a log archiver share a memory limit, as a
pod's containers do. The archiver keeps a ring of buffered logs (a new MiB
allocated every few ms, the oldest freed, as a log shipper's buffer turns
over), so the server's weights are evicted again and again and its requests
fault them back. Then, as a user would:

1. the plan (from the stored attributions) offers `confine:<archiver>` and
   names its pid;
2. applied, the archiver's new buffers are charged to a cgroup of its own:
   the shared limit empties of its ring within a turn of it, and the
   stand-in's P99 (its own clock) falls;
3. undone, the archiver is back in the shared limit and the cgroup made is
   gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jitterscope.fix_journal import Journal, memory_home
from jitterscope.reports import fix_plan
from jitterscope.workload import last_cpu
from tests.conftest import remove_cgroup, wait_until
from tests.integration.test_blocked_causes import (  # noqa: F401  (_own_cpu and pipeline: this module's fixtures too)
    CPU_MS, HEADROOM_MB, STANDIN, WEIGHTS_MB, MemoryLimit, _own_cpu, every_attribution, on_disk, pipeline, watching)

pytestmark = [pytest.mark.bpf, pytest.mark.integration]

RING_MB = 28  # more than the limit's headroom: the weights go
#: the archiver's ring of buffered logs: a MiB allocated (every page touched) every few ms, the oldest freed
#: (mapped and unmapped itself: malloc would keep the freed MiBs and hand them out again, never new pages)
ROTATING_ARCHIVER = """
import collections, ctypes, mmap, sys, time
ctypes.CDLL(None).prctl(15, b"{name}", 0, 0, 0)  # PR_SET_NAME
ring = collections.deque()
print("ready", flush=True)
while True:
    buffer = mmap.mmap(-1, 1 << 20)
    buffer.write(bytes(1 << 20))
    ring.append(buffer)
    if len(ring) > {mb}:
        ring.popleft().close()
    time.sleep(0.005)
"""
#: the stand-in holds at WATCHED_AT until the collector watches it; WARM requests before the archiver starts;
#: PHASE requests beside it, before the fix and after
WATCHED_AT, WARM, PHASE = 20, 40, 80


def p99(walls: list[float]) -> float:
    return sorted(walls)[int(0.99 * (len(walls) - 1))]


def test_an_evictor_confined_by_fix_stops_evicting_the_server_s_weights(pipeline, tmp_path):  # noqa: F811
    stack, worker, collector, otlp_port = pipeline
    memory, archiver, journal = MemoryLimit(), None, Journal(tmp_path)
    name = f"ring-{os.getpid() % 100000}"
    confined = Path(memory_home(os.getpid()).root) / f"{fix_plan.CONFINED_PREFIX}{name}"
    before_at, after_at = WARM, WARM + PHASE
    standin = subprocess.Popen(
        [sys.executable, str(STANDIN), "--endpoint", f"http://127.0.0.1:{otlp_port}/v1/traces",
         "--pin-cpu", str(last_cpu()), "--requests", str(WARM + 2 * PHASE), "--cpu-ms", str(CPU_MS),
         "--gap-ms", "10", "--id-prefix", "conf-", "--times", "--cpu-times", "--weights-mb", str(WEIGHTS_MB),
         "--scratch", str(on_disk(tmp_path)), "--hold-at", str(WATCHED_AT), "--hold-at", str(before_at),
         "--hold-at", str(after_at)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=memory.join)

    def go() -> None:
        standin.stdin.write("go\n")
        standin.stdin.flush()

    def served(upto: int) -> None:
        while len(lines) < upto:
            line = standin.stdout.readline()
            assert line, "the stand-in ended early"
            lines.append(line.split())

    lines: list[list[str]] = []
    try:
        wait_until(lambda: watching(collector, standin.pid), 120, "the collector's blocked probe on the stand-in",
                   collector)
        memory.limit(memory.usage() + HEADROOM_MB * (1 << 20))
        go()
        served(before_at)
        archiver = subprocess.Popen([sys.executable, "-c", ROTATING_ARCHIVER.format(name=name, mb=RING_MB)],
                                    stdout=subprocess.PIPE, text=True, preexec_fn=lambda: (
                                        memory.join(), os.sched_setaffinity(0, {0})))
        assert archiver.stdout.readline().strip() == "ready"
        go()
        served(after_at)

        # 1. the plan, from what the pipeline stored of the requests served beside the archiver
        evicted = [f"conf-{i}" for i in range(before_at, after_at)]
        got = every_attribution(stack, worker, evicted)
        [[host]] = stack.query("SELECT any(host) FROM jitterscope.request_attribution FINAL "
                               "WHERE request_id = {id:String}", id=evicted[0])
        rows = stack.query(fix_plan.REQUESTS_SQL, host=host, since=3600)
        processes = fix_plan.processes_of(stack.query(fix_plan.PROCESSES_SQL, host=host))
        actions, not_offered = fix_plan.plan(fix_plan.requests_of(rows), processes, [0, 1], fix_plan.read_live,
                                             memory_of=memory_home)
        named = sum(got[r]["cause"] == "memory_stall" and got[r]["culprit"] == f"{name} (pid {archiver.pid})"
                    for r in evicted)
        confine = next((a for a in actions if a.key == f"confine:{name}"), None)
        assert confine is not None and archiver.pid in confine.confine.moves, (named, actions, not_offered)

        # 2. applied: its ring turns over into its own limit, and the shared one has room for the weights again
        journal.apply(actions, [confine.key])
        assert memory_home(archiver.pid).procs == f"{confined}/cgroup.procs"
        usage = confined / ("memory.usage_in_bytes" if memory.v1 else "memory.current")
        wait_until(lambda: int(usage.read_text()) >= RING_MB << 20, 60, "the archiver's ring turned over into its "
                   "own limit (out of the shared one)")
        go()
        served(after_at + PHASE)
        standin.stdin.close()
        assert standin.wait(120) == 0

        # 3. undone: back in the shared limit, the cgroup made gone
        undone = journal.undo()
        assert memory_home(archiver.pid).procs == str(memory.path / "cgroup.procs") and not confined.exists(), undone
    finally:
        for process in (standin, archiver):
            if process:
                process.kill()
                process.wait()
        if confined.exists():
            remove_cgroup(confined)
        memory.remove()
    walls = {f[0]: (int(f[2]) - int(f[1])) / 1e6 for f in lines if len(f) == 5}
    before = [walls[f"conf-{i}"] for i in range(before_at + 5, after_at)]
    after = [walls[f"conf-{i}"] for i in range(after_at + 5, after_at + PHASE)]
    print(f"\n[measured] {named} of {len(evicted)} requests beside the archiver named memory_stall by it; the "
          f"stand-in's P99 {p99(before):.1f} ms beside it, {p99(after):.1f} ms once `fix` confined it "
          f"({p99(before) / p99(after):.1f}x; the plan said P99 -{confine.gain_p99_ms} ms)")
    assert named >= 0.5 * len(evicted)
    assert p99(after) * 3 <= p99(before)
