# SPDX-License-Identifier: Apache-2.0
"""What the blocked probe sends from a real vLLM under load (closed-loop
completions, ARM_S an arm, ROUNDS rounds alternating): events a second and
blocked seconds a second, of the program in BENCH_BLOCKED_BEFORE (another
checkout's bpf/, e.g. `git worktree add /tmp/before HEAD~1`) against this
tree's, with the top (kind, thread name, who woke it) of each. Blocked
seconds that stay the same say no time was lost; fewer events, what the
collector no longer reads.

    BENCH_BLOCKED_BEFORE=/tmp/before/bpf .venv/bin/python bench/blocked_rate.py
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO  # noqa: E402  (bench/ is on sys.path)
from vllm_cost import MODEL, VENV, _phase, serve_command  # noqa: E402

sys.path.insert(0, str(REPO))
from jitterscope.broker import free_port  # noqa: E402
from jitterscope.collector.probes import base  # noqa: E402
from jitterscope.collector.probes.blocked import BlockedProbe  # noqa: E402
from tests.vllm.test_real_vllm import complete, ready  # noqa: E402

ROUNDS, ARM_S = 2, 25.0


def waker_of(event) -> str:
    if event.waker_pid == 0:
        return "its own timer" if event.waker_tid == event.tid else "no task (an interrupt)"
    return "a task"


def arm(name: str, bpf_dir: Path, pids: list[int], api: int) -> None:
    base.bpf_source = lambda source: bpf_dir / source
    tally, events, blocked_ns = collections.Counter(), [0], [0]

    def on_event(event) -> None:
        events[0] += 1
        blocked_ns[0] += event.blocked_ns
        tally[(event.kind, event.comm[:12], waker_of(event))] += 1

    with BlockedProbe(threshold_ns=1_000_000, watched=pids) as probe:
        probe.open(on_event)
        start, n = time.monotonic(), 0
        while time.monotonic() - start < ARM_S:
            complete(api, f"r{n}")
            n += 1
            probe.poll(0)
        probe.poll(0)
        took = time.monotonic() - start
        print(f"{name}: {events[0] / took:,.0f} events/s, blocked {blocked_ns[0] / 1e9 / took:.2f} s/s, "
              f"{n} requests, ring-buffer drops {probe.drops()}")
        for (kind, comm, waker), count in tally.most_common(6):
            print(f"    {count:7,} {kind} {comm} woken by {waker}")


def main() -> None:
    before = Path(os.environ["BENCH_BLOCKED_BEFORE"])
    api, otlp = free_port(), free_port()
    argv, env = serve_command(VENV, MODEL, api, f"http://127.0.0.1:{otlp}/v1/traces")
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while not ready(api):
                time.sleep(1)
            _phase(api, 10, "warm")
            pids = [int(p) for p in subprocess.run(["pgrep", "-s", str(server.pid)], capture_output=True,
                                                   text=True).stdout.split()]
            for round_ in range(ROUNDS):
                for name, bpf_dir in (("before", before), ("after", REPO / "bpf")):
                    arm(f"round {round_} {name}", bpf_dir, pids, api)
        finally:
            os.killpg(server.pid, 9)


if __name__ == "__main__":
    main()
