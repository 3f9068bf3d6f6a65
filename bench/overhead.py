# SPDX-License-Identifier: Apache-2.0
"""What the whole `jitterscope up` costs a host at idle, against runqslower.

The context-switch storm of bench/common.py (a C pipe ping-pong pinned to one
CPU, best of 3 runs against the best unloaded run of the same round),
beside libbpf-tools' runqslower alone, the collector alone (what a fleet
host runs: `jitterscope record`, its broker and workers elsewhere), then
beside a whole `up` -- broker,
streams worker and collector with every default signal, nothing else
running, no spans: the idle host of issue 18 part 5. The BPF time per
switch is the kernel's count for the collector's programs (fdinfo of the
collector process). ``up`` runs on every CPU, as a user's does. Each row
also gives the ping-pong's own CPU time per round trip over the unloaded
run's (bench/common.py storm_costs): steal-free, so steadier on a VM than
throughput, though blind to other processes taking the ping-pong's CPU.

The last row is the same whole `up` with empty programs on the three
syscall tracepoints the GPU ioctl probe held attached on every host until
2026-12-03 (b50c068), GPU or not: it now attaches them only while a process
holds a GPU device open, and the row is what that saves a GPU-less host.

    .venv/bin/python bench/run.py whole-up     # BENCH_REPEATS=N for N rounds (5)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from blocked import EmptyTracepoints, rows_against_runqslower  # noqa: E402  (bench/ is on sys.path)
from common import PINNED_C_MAIN, REPO, PeerTool, c_binary, c_ping_pong_binary, storm_costs  # noqa: E402


def _free_port() -> int:
    from jitterscope.broker import free_port

    return free_port()


def _started(argv: list[str], env: dict, marker: str) -> tuple[subprocess.Popen, list[str]]:
    """A process, once a line of its output holds ``marker``; its output lines so far (kept growing)."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    deadline = time.monotonic() + 600
    while not any(marker in line for line in lines):
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
        time.sleep(0.2)
    return proc, lines


def _interrupt(proc: subprocess.Popen, timeout_s: float) -> None:
    """Ctrl-C, as a user stops it; killed if it has not exited in ``timeout_s``."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()



def collector_of(parent: int) -> int | None:
    """The pid of `up`'s collector (its child running `jitterscope.cli collector`), if it has one."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == parent and b"collector" in args:
                return int(entry)
    return None

class WholeUp:
    """`jitterscope up` until closed (Ctrl-C), started once it says it is
    watching; ``bpf_pid`` is its collector (whose fds hold the programs)."""

    def __init__(self, data_dir: Path, *extra: str):
        env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")}
        env.update(JITTERSCOPE_DATA_DIR=str(data_dir), JITTERSCOPE_STREAMS_WEB_PORT=str(_free_port()),
                   JITTERSCOPE_OTLP_PORT=str(_free_port()), JITTERSCOPE_COLLECTOR_METRICS_PORT="0")
        cli = [str(REPO / ".venv/bin/jitterscope")]
        self.proc, self.lines = _started([*cli, "up", "--broker-port", "0", *extra], env, "jitterscope up: watching")
        self.bpf_pid = self._collector()

    def _collector(self) -> int:
        pid = collector_of(self.proc.pid)
        assert pid, "no collector under up:\n" + "".join(self.lines)
        return pid

    def close(self) -> None:
        _interrupt(self.proc, 300)  # up drains what the collector sent before it exits


class SyscallTracepoints(EmptyTracepoints):
    """Programs that return at once where b50c068's GPU ioctl probe sat on
    every host: any attached syscall tracepoint sends every syscall of every
    process down the kernel's traced path."""

    TRACEPOINTS = ("syscalls:sys_enter_ioctl", "syscalls:sys_exit_ioctl", "syscalls:sys_enter_close")


class UpWithSyscallTracepoints(WholeUp):
    """A whole `up` as b50c068 ran it on a host with no GPU user."""

    def __init__(self, data_dir: Path):
        super().__init__(data_dir)
        self.syscalls = SyscallTracepoints()

    def close(self) -> None:
        self.syscalls.close()
        super().close()


class CollectorAlone:
    """The collector by itself, as a fleet host runs it (its broker and
    workers elsewhere): `jitterscope record` into a file, until closed."""

    def __init__(self, out: Path):
        cli = [str(REPO / ".venv/bin/jitterscope")]
        env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")}
        env["JITTERSCOPE_COLLECTOR_METRICS_PORT"] = "0"
        env["JITTERSCOPE_OTLP_PORT"] = str(_free_port())
        self.proc, self.lines = _started([*cli, "record", "--out", str(out), "--duration", "86400"], env,
                                         '"collector started"')
        self.bpf_pid = self.proc.pid

    def close(self) -> None:
        _interrupt(self.proc, 120)


def bench_whole_up(rounds: int = 100_000, repeats: int = int(os.environ.get("BENCH_REPEATS", 5))) -> str:
    from jitterscope.collector.selfcost import BpfStats

    assert Path("/usr/sbin/runqslower").exists(), "runqslower missing: apt-get install libbpf-tools"
    cpu = 0
    os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - {cpu} or {cpu})  # the bench's own reads off it
    with tempfile.TemporaryDirectory() as tmp, BpfStats():
        binary = c_ping_pong_binary(Path(tmp))
        setups = {
            "runqslower 5000": lambda: PeerTool("/usr/sbin/runqslower", "5000"),
            "the collector alone (`record` to a file), default signals": lambda: CollectorAlone(Path(tmp) / "rec.gz"),
            "whole up, idle (broker, worker, collector, default signals)":
                lambda: WholeUp(Path(tempfile.mkdtemp(dir=tmp))),
            "whole up, idle, with the syscall tracepoints b50c068's GPU probe attached on every host":
                lambda: UpWithSyscallTracepoints(Path(tempfile.mkdtemp(dir=tmp))),
        }
        costs = storm_costs(setups, binary, rounds, cpu, repeats)
    return rows_against_runqslower(costs, cpu, repeats)


SYSCALL_LOOP_C = r"""
/* `sysloop N CPU`: N getppid() calls pinned to CPU; prints ns per call. */
""" + PINNED_C_MAIN + r"""
    long n = atol(argv[1]);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        syscall(SYS_getppid);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}
"""


def bench_syscall_tracepoints(calls: int = 2_000_000, repeats: int = int(os.environ.get("BENCH_REPEATS", 8))) -> str:
    """What an attached syscall tracepoint costs every other syscall of the
    host: a getppid() loop (no program of ours runs for it) with nothing
    loaded, with the GPU ioctl probe watching nothing (detached, as now),
    and with the same probe's tracepoints attached, as b50c068 held them on
    every host. Alternating rounds, best of 3 loops each; the ratio is the
    median of each round's pair, so drift between rounds cancels."""
    import statistics

    from jitterscope.collector.probes.gpu_ioctl import GpuIoctlProbe

    cpu = 0
    os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - {cpu} or {cpu})
    with tempfile.TemporaryDirectory() as tmp:
        binary = c_binary(Path(tmp), "sysloop", SYSCALL_LOOP_C)

        def ns_per_call() -> float:
            return min(float(subprocess.run([str(binary), str(calls), str(cpu)], capture_output=True, check=True,
                                            text=True).stdout) for _ in range(3))

        names = ("nothing loaded", "the GPU ioctl probe, nothing watched (detached)",
                 "the GPU ioctl probe's syscall tracepoints attached (b50c068, every host)")
        runs: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(repeats):
            runs[names[0]].append(ns_per_call())
            with GpuIoctlProbe(threshold_ns=5_000_000) as probe:
                assert not probe.attached
                runs[names[1]].append(ns_per_call())
                probe.attach_tracepoints(True)
                runs[names[2]].append(ns_per_call())
    base = runs[names[0]]
    return "\n".join(
        f"| getppid() loop on CPU {cpu}, {name} | {statistics.median(v):.0f} ns per call (median of {repeats}, range "
        f"{min(v):.0f}..{max(v):.0f}) | nothing loaded: {statistics.median(base):.0f} ns | "
        f"{statistics.median([a / b for a, b in zip(v, base)]):.2f}x (paired by round) |" for name, v in runs.items())


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    print(bench_whole_up())
