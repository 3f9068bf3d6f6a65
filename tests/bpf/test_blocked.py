# SPDX-License-Identifier: Apache-2.0
"""The blocked-thread probe on the real kernel: child processes that sleep,
contend for the GIL, read with O_DIRECT and fault in a dropped mapping, each
measuring its own ground truth (the monotonic clock the kernel stamps events
with, and its thread's schedstat: time on the CPU and time runnable), which
the probe's events are held against."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from jitterscope.collector import pyruntime
from jitterscope.collector.probes import blocked
from jitterscope.collector.probes.blocked import BlockedProbe, BlockedSignal
from jitterscope.collector.probes.blockio import MINOR_BITS, disks_of
from jitterscope.schemas import events
from tests.conftest import wait_until
from tests.unit.collector.probes.test_probe_decoding import fake_context

pytestmark = pytest.mark.bpf

MS = 1_000_000

# What every child shares: its thread's schedstat (ns on the CPU, ns runnable
# waiting for one), and a JSON line to the test.
_PRELUDE = r"""
import json, os, sys, threading, time
def schedstat():
    run, delay, _ = open("/proc/thread-self/schedstat").read().split()
    return int(run), int(delay)
_said = threading.Lock()
def say(**kw):  # one whole line at a time: print() writes the line and its newline apart, and threads interleave
    with _said:
        sys.stdout.write(json.dumps(kw) + "\n")
        sys.stdout.flush()
def ask():
    return sys.stdin.readline().strip()
"""


class Child:
    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid

    def read(self) -> dict:
        line = self.popen.stdout.readline()
        assert line, f"child {self.pid} exited ({self.popen.poll()})"
        return json.loads(line)

    def send(self, text: str = "go") -> None:
        self.popen.stdin.write(text + "\n")
        self.popen.stdin.flush()


@contextmanager
def child(body: str):
    popen = subprocess.Popen([sys.executable, "-c", _PRELUDE + body], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        yield Child(popen)
    finally:
        popen.kill()
        popen.wait()


def collect(probe: BlockedProbe, seen: list, condition, timeout: float, what: str) -> None:
    """Poll until ``condition()`` holds (deadline ``timeout``), then read
    what is still in flight for a moment. A timeout says what was seen, per
    thread, and what the probe dropped."""
    def polled():
        probe.poll(50)
        return condition()
    try:
        wait_until(polled, timeout, what, interval=0.05)
    except AssertionError as timed_out:
        tids = sorted({e.tid for e in seen})
        per_thread = "; ".join(f"{tid}: {summary([e for e in seen if e.tid == tid])}" for tid in tids)
        raise AssertionError(f"{timed_out}\nseen ({len(seen)} events): {per_thread}\n"
                             f"drops {probe.drops()}, map full {probe.map_full_drops()}") from None
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        probe.poll(50)


def summary(evs) -> str:
    return ", ".join(f"{e.kind}:{e.blocked_ns / MS:.2f}ms<-{e.waker_tid}({e.waker_comm}) at {e.ts_ns // MS % 100_000}"
                     for e in evs[:20])


# -- sleep ---------------------------------------------------------------------------------
SLEEPER = r"""
ask()
def work(n):
    say(tid=threading.get_native_id())
    took = []
    for _ in range(n):
        t = time.monotonic_ns(); time.sleep(0.05); took.append(time.monotonic_ns() - t)
    say(took=took)
w = threading.Thread(target=work, args=(5,)); w.start(); w.join()
ask()
"""


def test_sleeps_of_a_watched_thread_and_none_of_an_unwatched_process():
    with child(SLEEPER) as watched, child(SLEEPER) as other, \
            BlockedProbe(threshold_ns=1 * MS, watched=[watched.pid]) as probe:
        seen = []
        probe.open(seen.append)
        watched.send()
        other.send()
        tid = watched.read()["tid"]
        took = watched.read()["took"]
        other_tid = other.read()["tid"]
        other.read()

        def mine():
            return sorted((e for e in seen if e.tid == tid and e.blocked_ns >= 40 * MS), key=lambda e: e.ts_ns)
        collect(probe, seen, lambda: len(mine()) >= len(took), 10, "the 5 sleeps")
        print(f"sleeps measured by the child: {[round(t / MS, 2) for t in took]} ms; "
              f"events: {summary(mine())}")
        evs = mine()
        assert len(evs) == len(took) == 5
        for e, real in zip(evs, took):
            assert e.kind == "sleep" and e.state == 1 and e.pid == watched.pid and e.comm == "python"
            assert 45 * MS <= e.blocked_ns <= 500 * MS
            assert e.blocked_ns <= real + 1 * MS, "blocked only while the sleep lasted"
        assert not [e for e in seen if e.pid == other.pid or e.tid == other_tid], "unwatched: no events"
        assert probe.drops() == 0 and probe.map_full_drops() == 0


def test_nothing_watched_nothing_attached_and_watching_again_sees_sleeps():
    """With no process watched the probe's programs are not attached (every
    switch on the host would run them for nothing); watching attaches them
    again, and a sleep is seen as before."""
    with BlockedProbe(threshold_ns=1 * MS) as probe:
        seen = []
        probe.open(seen.append)
        assert not probe.attached
        for _ in range(2):  # attached, detached, attached again
            with child(SLEEPER) as watched:
                probe.set_watched([watched.pid])
                assert probe.attached
                watched.send()
                tid = watched.read()["tid"]
                took = watched.read()["took"]
                collect(probe, seen, lambda: len([e for e in seen if e.tid == tid and e.blocked_ns >= 40 * MS])
                        >= len(took), 10, f"the 5 sleeps of thread {tid} (it measured {[t // MS for t in took]} ms)")
            probe.set_watched([])
            assert not probe.attached


POLLER = r"""
import select
ask()
woken = threading.Event()
def poller():
    say(poller=threading.get_native_id())
    t = time.monotonic_ns()
    for _ in range(60):
        select.select([], [], [], 0.005)   # a poll loop: each sleep ended by its own timeout
    say(polled=time.monotonic_ns() - t)
def waiter():
    say(waiter=threading.get_native_id())
    woken.wait()                            # woken by the main thread, no timeout
p = threading.Thread(target=poller); w = threading.Thread(target=waiter)
p.start(); w.start(); p.join()
say(main=threading.get_native_id())
woken.set(); w.join()
ask()
"""


def test_a_poll_loop_is_one_event_per_run_and_a_wake_names_its_waker():
    """A thread's sleeps ended by their own timer, back to back, come out as
    a few runs (their time summed, the last sent as the thread exits; no
    waker: waker_pid 0 and its own tid, whatever task the timer interrupted);
    a sleep another thread ended is an event of its own that names that thread."""
    with child(POLLER) as c, BlockedProbe(threshold_ns=1 * MS, watched=[c.pid]) as probe:
        seen = []
        probe.open(seen.append)
        c.send()
        said = {}
        while "main" not in said:
            said.update(c.read())
        poller, waiter, main = said["poller"], said["waiter"], said["main"]
        collect(probe, seen, lambda: any(e.tid == waiter for e in seen), 10, "the waiter's wake")
        polls = [e for e in seen if e.tid == poller]
        print(f"poll loop ({said['polled'] / MS:.1f} ms): {summary(polls)}; waiter: "
              f"{summary([e for e in seen if e.tid == waiter])}")
        assert 0 < len(polls) <= 20, "60 polls of 5 ms: a run spans at most 100 ms"
        assert {(e.kind, e.waker_pid, e.waker_tid) for e in polls} == {("sleep", 0, poller)}
        slept = sum(e.blocked_ns for e in polls)  # the last run too: sent as the poller exited
        assert 0.5 * said["polled"] <= slept <= said["polled"], "the polls' sleep, less the moments between"
        [wake] = [e for e in seen if e.tid == waiter]
        assert (wake.kind, wake.waker_pid, wake.waker_tid) == ("sleep", c.pid, main)


# -- the GIL ---------------------------------------------------------------------------------
GIL_PAIR = r"""
def spin():
    say(a=threading.get_native_id())
    x = 0
    while True:
        x += 1
def stepper(seconds):
    tid = threading.get_native_id()
    run0, delay0 = schedstat(); start = time.monotonic_ns(); steps = 0
    while time.monotonic_ns() - start < seconds * 1e9:
        x = 0
        for i in range(300):   # a short pure-Python step: it needs the GIL
            x += i
        steps += 1
    end = time.monotonic_ns(); run1, delay1 = schedstat()
    say(b=tid, start=start, end=end, run=run1 - run0, delay=delay1 - delay0, steps=steps)
ask()
threading.Thread(target=spin, daemon=True).start()
time.sleep(0.05)
stepper(2.0)
ask()
"""

ONE_THREAD = r"""
ask()
tid = threading.get_native_id(); took = []
for _ in range(10):
    x = 0
    for i in range(100000):
        x += i
    t = time.monotonic_ns(); time.sleep(0.01); took.append(time.monotonic_ns() - t)
say(tid=tid, took=took)
ask()
"""


@pytest.mark.parametrize("cpus", ["one", "all"])
def test_gil_waits_name_the_holder_and_account_for_the_lost_time(cpus):
    """One CPU: the 5 ms timeout's timer interrupts the holder. All CPUs:
    it fires on the waiter's idle CPU, and the wait that follows it (the
    holder signals) joins it in one event."""
    body = GIL_PAIR if cpus == "one" else "os.sched_setaffinity(0, range(os.cpu_count()))\n" + GIL_PAIR
    with child(body) as c, BlockedProbe(threshold_ns=1 * MS, watched=[]) as probe:
        site = pyruntime.locate(c.pid)
        assert isinstance(site, pyruntime.GilSite), site
        probe.set_watched({c.pid})
        probe.watch_gil(site)
        seen = []
        probe.open(seen.append)
        c.send()
        a = c.read()["a"]  # the GIL holder, spinning
        b = c.read()       # the stepper's own account of its 2 s

        def gil_of_b():
            return [e for e in seen if e.tid == b["b"] and e.kind == "gil"
                    and b["start"] <= e.ts_ns - e.blocked_ns and e.ts_ns <= b["end"] + 10 * MS]
        collect(probe, seen, lambda: gil_of_b(), 10, "GIL waits of the stepper")
        evs = gil_of_b()
        wall = b["end"] - b["start"]
        blocked_truth = wall - b["run"] - b["delay"]  # neither on a CPU nor runnable
        # each wait's part inside the stepper's account (the last may end after it: the window has 10 ms of slack)
        total = sum(min(e.ts_ns, b["end"]) - max(e.ts_ns - e.blocked_ns, b["start"]) for e in evs)
        by_holder = sum(e.waker_tid == a for e in evs)
        print(f"{cpus} CPU(s): stepper {b['b']}: wall {wall / MS:.0f} ms, on CPU {b['run'] / MS:.0f} ms, runnable "
              f"{b['delay'] / MS:.0f} ms, blocked {blocked_truth / MS:.0f} ms; {len(evs)} gil events "
              f"totalling {total / MS:.0f} ms, {by_holder} woken by the holder {a}; others: "
              f"{summary([e for e in seen if e.tid == b['b'] and e.kind != 'gil'])}")
        assert blocked_truth > 0.2 * wall, "premise: two threads share one GIL, the stepper waits for it"
        assert total >= 0.5 * blocked_truth, "most of the stepper's blocked time is GIL waits"
        # the kernel's run delay starts at the enqueue, the probe's block ends at sched_wakeup just after it:
        # that gap counts as both blocked and runnable (a few us an event; more if the host steals the vCPU there)
        assert total <= blocked_truth + 5 * MS + len(evs) * 20_000, "and never more than it was blocked"
        assert by_holder >= 0.6 * len(evs), "the waker is the thread that held the GIL"
        assert all(e.pid == c.pid and e.state == 1 for e in evs)


def test_a_single_busy_thread_has_no_gil_waits():
    with child(ONE_THREAD) as c, BlockedProbe(threshold_ns=1 * MS, watched=[c.pid]) as probe:
        probe.watch_gil(pyruntime.locate(c.pid))
        seen = []
        probe.open(seen.append)
        c.send()
        truth = c.read()
        tid = truth["tid"]

        def sleeps():
            return [e for e in seen if e.tid == tid and e.blocked_ns >= 8 * MS]
        collect(probe, seen, lambda: len(sleeps()) >= len(truth["took"]), 10,
                f"the 10 sleeps of thread {tid} (as it measured them: {[round(t / MS, 2) for t in truth['took']]} ms)")
        print(f"one thread: {summary(sleeps())}")
        assert len(sleeps()) == 10 and {e.kind for e in sleeps()} == {"sleep"}
        assert not [e for e in seen if e.kind == "gil"], "no second thread: nobody waits for the GIL"


# -- I/O -------------------------------------------------------------------------------------
DIRECT_READER = r"""
import mmap, random
path = sys.argv[1]
ask()
try:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT); direct = True
except OSError:
    fd = os.open(path, os.O_RDONLY); direct = False
CHUNK = 1 << 20  # reads of 1 MiB: the disk's time outweighs the VM's ~0.1 ms to wake a thread
buf = mmap.mmap(-1, CHUNK)   # page-aligned, as O_DIRECT wants
size = os.fstat(fd).st_size
tid = threading.get_native_id(); took = []
random.seed(1)
offsets = random.sample(range(0, size, CHUNK), size // CHUNK)
run0, delay0 = schedstat(); start = time.monotonic_ns()
for off in offsets:
    if not direct:
        os.posix_fadvise(fd, off, CHUNK, os.POSIX_FADV_DONTNEED)
    t = time.monotonic_ns(); os.preadv(fd, [buf], off); took.append(time.monotonic_ns() - t)
end = time.monotonic_ns(); run1, delay1 = schedstat()
say(tid=tid, direct=direct, took=took, start=start, end=end, run=run1 - run0, delay=delay1 - delay0)
ask()
"""


def make_file(path: Path, mib: int) -> None:
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def test_direct_reads_are_io(tmp_path):
    data = tmp_path / "data"
    make_file(data, 32)
    body = DIRECT_READER.replace("sys.argv[1]", repr(str(data)))
    with child(body) as c, BlockedProbe(threshold_ns=10_000, watched=[c.pid]) as probe:  # 0.01 ms
        seen = []
        probe.open(seen.append)
        c.send()
        truth = c.read()

        def in_loop(kinds):
            return [e for e in seen if e.tid == truth["tid"] and e.kind in kinds
                    and truth["start"] <= e.ts_ns - e.blocked_ns and e.ts_ns <= truth["end"]]
        collect(probe, seen, lambda: in_loop(("io",)), 10, "io events of the reader")
        took = truth["took"]
        io = in_loop(("io",))
        total = sum(e.blocked_ns for e in io)
        blocked_truth = truth["end"] - truth["start"] - truth["run"] - truth["delay"]
        print(f"{len(took)} reads (O_DIRECT: {truth['direct']}) took {sum(took) / MS:.1f} ms, median "
              f"{sorted(took)[len(took) // 2] / 1000:.0f} us; the loop was blocked {blocked_truth / MS:.1f} ms; "
              f"{len(io)} io events totalling {total / MS:.1f} ms; others: {summary(in_loop(('gil', 'memory', 'sleep')))}")
        assert io and all(e.state == 2 and e.pid == c.pid for e in io)
        # each names the device the file is on (the block layer may see its partition or the disk)
        st_dev = os.stat(data).st_dev
        devices = {(os.major(st_dev), os.minor(st_dev)), *disks_of(st_dev)}
        assert {(e.dev >> MINOR_BITS, e.dev & ((1 << MINOR_BITS) - 1)) for e in io} <= devices, (devices, io[:3])
        assert total >= 0.5 * blocked_truth, "the loop's blocked time is waiting for the disk"
        assert total <= blocked_truth + 1 * MS and total <= sum(took), "blocked only inside the reads"
        assert not in_loop(("memory", "gil"))


# -- memory ----------------------------------------------------------------------------------
TOUCHER = r"""
import mmap
path = sys.argv[1]
ask()
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)   # clean and unmapped: dropped from the page cache
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
tid = threading.get_native_id()
majflt0 = int(open("/proc/thread-self/stat").read().rsplit(")", 1)[1].split()[9])
run0, delay0 = schedstat(); start = time.monotonic_ns()
x = 0
for off in range(0, len(m), 4096):
    x += m[off]
end = time.monotonic_ns(); run1, delay1 = schedstat()
majflt = int(open("/proc/thread-self/stat").read().rsplit(")", 1)[1].split()[9]) - majflt0
say(tid=tid, start=start, end=end, run=run1 - run0, delay=delay1 - delay0, majflt=majflt)
ask()
"""


def test_faults_on_a_dropped_mapping_are_memory(tmp_path):
    data = tmp_path / "mapped"
    make_file(data, 64)
    body = TOUCHER.replace("sys.argv[1]", repr(str(data)))
    with child(body) as c, BlockedProbe(threshold_ns=10_000, watched=[c.pid]) as probe:  # 0.01 ms
        seen = []
        probe.open(seen.append)
        c.send()
        t = c.read()

        def memory():
            return [e for e in seen if e.tid == t["tid"] and e.kind == "memory"
                    and t["start"] <= e.ts_ns - e.blocked_ns and e.ts_ns <= t["end"]]
        collect(probe, seen, memory, 10, "memory events of the toucher")
        wall = t["end"] - t["start"]
        blocked_truth = wall - t["run"] - t["delay"]
        total = sum(e.blocked_ns for e in memory())
        others = [e for e in seen if e.tid == t["tid"] and e.kind != "memory"
                  and t["start"] <= e.ts_ns - e.blocked_ns and e.ts_ns <= t["end"]]
        print(f"touch loop: wall {wall / MS:.1f} ms, blocked {blocked_truth / MS:.1f} ms, {t['majflt']} major "
              f"faults; {len(memory())} memory events totalling {total / MS:.1f} ms; others in the loop: "
              f"{summary(others)}")
        assert t["majflt"] > 0, "premise: the pages were not in the page cache"
        assert total >= 0.5 * blocked_truth, "the loop's blocked time is memory"
        # the fault storm's on-CPU part (allocating, mapping, readahead) counts too, never more than the loop had
        assert total <= wall - t["delay"] + 2 * MS


# -- targets that exit, and the signal -------------------------------------------------------
IDLE = r"""
say(tid=threading.get_native_id())
threading.Thread(target=lambda: time.sleep(600), daemon=True).start()
while ask():
    pass
"""


def test_a_target_that_exits_while_watched_is_forgotten():
    with BlockedProbe(threshold_ns=1 * MS) as probe:
        seen = []
        probe.open(seen.append)
        with child(IDLE) as c:
            c.read()
            probe.set_watched({c.pid})
            site = pyruntime.locate(c.pid)
            probe.watch_gil(site)
            assert probe.gil_watched() == {c.pid} and len(probe._bpf.uprobe_fds) == 2
            c.popen.kill()
            c.popen.wait()
        probe.poll(50)
        probe.forget({c.pid})  # its /proc/PID/root/... libc path is gone: no crash
        assert probe.watched() == set() and probe.gil_watched() == set()
        assert len(probe._bpf[b"gil"]) == 0 and probe._bpf.uprobe_fds == {}
        assert not [k for k, v in probe._bpf[b"blocked_at"].items() if v.tgid == c.pid]

        with pytest.raises(Exception):  # attaching to a process that has gone fails ...
            probe.watch_gil(site)
        assert probe.gil_watched() == set() and probe._bpf.uprobe_fds == {}, "... leaving nothing behind"


def test_signal_watches_serving_groups_and_labels_its_own_wakers(monkeypatch):
    with child(IDLE) as c, child(IDLE) as gone:
        c.read()
        gone.read()
        ctx = fake_context(own={os.getpid(): "collector"})
        assert ctx.settings.blocked_threshold_ms == 1.0
        signal = BlockedSignal()
        signal.open(ctx)
        try:
            # a serving process, jitterscope's own (never watched), and one that exits mid-attach
            site = pyruntime.locate(gone.pid)
            gone.popen.kill()
            gone.popen.wait()
            real = pyruntime.locate
            monkeypatch.setattr(blocked.pyruntime, "locate",
                                lambda pid, proc=Path("/proc"): site if pid == gone.pid else real(pid, proc))
            signal.set_targets(None, {c.pid: 1, os.getpid(): 1, gone.pid: 1})
            assert signal.probe.watched() == {c.pid, gone.pid}
            assert signal.gil_status[c.pid].startswith("measured: CPython 3.11")
            assert signal.gil_status[gone.pid] == blocked.EXITED
            assert signal.probe.gil_watched() == {c.pid}

            c.send()  # its main thread was blocked reading stdin since before it was watched ...
            time.sleep(0.05)
            c.send()  # ... and is again, now watched: we wake it
            wait_until(lambda: signal.poll(50) or [r for r in ctx.published if r.tid == c.pid], 10,
                       "the wait for stdin")
            rec = next(r for r in ctx.published if r.tid == c.pid)
            assert isinstance(rec, events.BlockedWait) and rec.kind == "sleep" and rec.pid == c.pid
            assert rec.waker_pid == os.getpid() and rec.waker_comm.startswith(events.OWN_SUSPECT_PREFIX)
            assert c.pid in ctx.described and signal.periodic(1, 2) == []

            signal.forget({gone.pid})
            signal.set_targets(None, {})  # left the serving groups
            assert signal.probe.watched() == set() and signal.probe.gil_watched() == set()
            assert signal.gil_status == {}
        finally:
            signal.close()
            signal.close()
