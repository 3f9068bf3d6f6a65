# SPDX-License-Identifier: Apache-2.0
"""Xid errors end to end on the real kernel log, without a GPU: real NVRM
Xid lines written into /dev/kmsg (as root; the kernel gives them facility
user, so the probe's read(2) relabels exactly this test's own lines as the
kernel's, standing in for the driver's printk: `as_the_driver`) reach the
real xid probe, which
follows the log from its start (lines written before it are not replayed),
parses them, maps each to its GPU by PCI address through a topology read
from the captured-format 2-socket 8-GPU sysfs tree (tests/fixtures), and
stamps it with the kernel's time of the line; the ``xid`` alert names that
GPU, its node, the process and NVIDIA's meaning; a line of an unknown shape
is counted, not raised.

Then the join: the GPU stand-in server (tests/gpu_standin.py, /dev/nvidia0
in its own mount namespace) writes an Xid for its GPU and one for another
GPU into the kernel log in the middle of one request, and sleeps there (a
hung kernel's wait, which no probe sees). Its process's GPU is found the way
the collector finds it (/dev/nvidia0 in its file table, through the
topology), and the attribution of that request, and of no other, names the
Xid of its own GPU, as the cause of its unexplained excess.

And the forgeries (issue 40, item 7), on the real kernel log with nothing
relabelled: as nobody, ``unshare -Urm mount -t tmpfs -o 'NVRM: Xid
(PCI:...): 79 ...'`` makes the kernel log the text inside its own "tmpfs:
Unknown parameter" line, and root writes a whole NVRM Xid line into
/dev/kmsg: neither becomes a record (so no alert, no cause); both are
counted as refused."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from jitterscope.collector import topology
from jitterscope.collector.agent import Stamp
from jitterscope.collector.otlp import OtlpReceiver
from jitterscope.collector.probes.interface import ProbeContext
from jitterscope.collector.probes.xid import XidSignal
from jitterscope.common.settings import Settings
from jitterscope.schemas import events
from jitterscope.streams.attribution import Attributor
from jitterscope.streams.rules import xid as xid_rule
from jitterscope.streams.rules.base import Thresholds
from tests.conftest import wait_until
from tests.fixtures.sysfs_builder import build_host
from tests.gpu_standin import PROCESS_NAME, GpuStandin

pytestmark = pytest.mark.bpf

MS = 1_000_000
GPU0, GPU4 = "0000:03:00.0", "0000:83:00.0"  # the fixture's nvidia0 (node 0) and nvidia4 (node 1)
XID_REQUEST, REQUESTS = 6, 12



def as_the_driver(marker: str):
    """read(2) of /dev/kmsg with the records carrying ``marker`` given
    facility kernel (0), as the NVIDIA driver's printk has: no user-space
    write can be (the kernel gives them facility user), and only the
    kernel's records are Xids."""
    def read(fd: int, size: int) -> bytes:
        data = os.read(fd, size)
        head, sep, rest = data.partition(b";")
        if sep and marker.encode() in rest.split(b"\n", 1)[0]:
            prio, _, tail = head.partition(b",")
            data = b"%d,%s;%s" % (int(prio) & 7, tail, rest)
        return data
    return read


def kmsg(line: str) -> None:
    """One record into the kernel log (a fresh open each time: the kernel
    takes at most 10 lines a burst per open file from user space)."""
    with open("/dev/kmsg", "w") as log:
        log.write(line + "\n")


class State:
    def __init__(self, topo, processes=()):
        self.topology = {topo.host: topo}
        self.processes = {(p.host, p.pid): p for p in processes}

    def serving_group(self, host, pid):
        return {pid}


@pytest.fixture(scope="module")
def host_topology(tmp_path_factory):
    fake = build_host(tmp_path_factory.mktemp("host"))
    found = topology.read_topology(fake.sys, fake.proc, nvml=False)
    assert {d.address: d.name for d in found["pci"] if d.kind == "gpu"}[GPU0] == "nvidia0"
    return found


def opened(topology_fields, read=os.read) -> tuple[XidSignal, list, Stamp]:
    stamp, published = Stamp("xid-host"), []
    signal = XidSignal(read=read)
    signal.open(ProbeContext(settings=Settings.model_construct(), stamp=stamp, publish=published.append,
                             describe_process=lambda pid: None, comm_of=lambda pid: "", topology=topology_fields))
    assert signal.follower is not None
    return signal, published, stamp


def polled(signal: XidSignal, published: list, count: int, what: str) -> list[events.GpuXid]:
    def done():
        signal.poll(0)
        return len(published) >= count
    wait_until(done, 30, what)
    signal.poll(0)
    return list(published)


def test_xid_lines_in_the_kernel_log_become_records_and_alerts(host_topology):
    marker = f"jitterscope-xid-test-{os.getpid()}-{time.time_ns()}"
    kmsg(f"<3>NVRM: Xid (PCI:0000:83:00): 48, pid=1, name=before, written before the probe opened {marker}")
    signal, published, stamp = opened(host_topology, as_the_driver(marker))
    try:
        before = time.time_ns()
        kmsg(f"<6>{marker}: an ordinary line, not the driver's")
        kmsg(f"<3>NVRM: Xid (PCI:0000:83:00): 79, pid=4242, name=vllm, GPU has fallen off the bus. {marker}")
        kmsg(f"<3>NVRM: Xid (PCI:0000:03:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception "
             f"on (GPC 0, TPC 0): {marker}")
        kmsg(f"<3>NVRM: Xid (43, pid: 5678): an unknown shape {marker}")
        kmsg(f"<4>NVRM: Xid (0000:01:00): 31, Ch 00000003, engmask 00000101 {marker}")
        after = time.time_ns()
        records = polled(signal, published, 3, "three Xid records from the kernel log")
    finally:
        signal.close()
    mine = [r for r in records if marker in r.message]
    assert [(r.xid, r.pci, r.gpu, r.pid, r.comm) for r in mine] == [
        (79, GPU4, "nvidia4", 4242, "vllm"), (13, GPU0, "nvidia0", 0, ""), (31, "0000:01:00.0", "", 0, "")]
    assert mine[0].message == f"GPU has fallen off the bus. {marker}"
    assert signal.unparsed == 1 and signal.events_read >= 3
    # the kernel's time of each line, in epoch ns: within the writes' bracket where debugfs gave the log
    # clock's offset from CLOCK_MONOTONIC (0.6 ms here), else within a few ms
    slack = 1 * MS if signal.clock_offset_ns else 5 * MS
    assert all(before - slack <= r.ts_ns <= after + slack for r in mine), [(r.ts_ns - before) / MS for r in mine]
    print(f"\n[xid] kernel log clock offset {signal.clock_offset_ns / MS:.3f} ms; lines at "
          + ", ".join(f"{(r.ts_ns - before) / MS:+.3f}" for r in mine) + f" ms of a {(after - before) / MS:.3f} ms bracket")
    assert all(r.host == "xid-host" and r.boot_id == stamp.boot_id for r in mine)

    topo = events.Topology(host="xid-host", boot_id=stamp.boot_id, seq=0, ts_ns=before, **host_topology)
    alerts = [xid_rule.judge(r, State(topo), Thresholds.defaults(), time.time_ns()) for r in mine]
    assert alerts[0].summary.startswith("Xid 79 on GPU nvidia4 (0000:83:00.0, node 1), process vllm (pid 4242): "
                                        "GPU has fallen off the bus")
    assert alerts[0].severity == "critical" and "reboot" in alerts[0].remedy
    assert alerts[1].summary.startswith("Xid 13 on GPU nvidia0 (0000:03:00.0, node 0): Graphics engine exception")
    assert "the GPU at 0000:01:00.0 (not in this host's topology)" in alerts[2].summary
    for a in alerts:
        print(f"\n[xid] {a.severity}: {a.summary}")


def test_requests_on_the_gpu_in_the_window_name_its_xid(host_topology):
    spans: list[dict] = []
    marker = f"jitterscope-xid-join-{os.getpid()}-{time.time_ns()}"
    signal, published, stamp = opened(host_topology, as_the_driver(marker))
    with OtlpReceiver("127.0.0.1", 0, spans.extend) as receiver, GpuStandin([
            "--call=nvidia0:NV_ESC_RM_ALLOC", f"--requests={REQUESTS}", "--gap-ms=20",
            f"--endpoint=http://127.0.0.1:{receiver.port}/v1/traces",
            f"--xid={XID_REQUEST}:<3>NVRM: Xid (PCI:0000:03:00): 79, pid={{pid}}, name=jsgpuinfer, "
            f"GPU has fallen off the bus. {marker}",
            f"--xid={XID_REQUEST}:<3>NVRM: Xid (PCI:0000:83:00): 74, pid=1, name=other, NVLink: fatal error {marker}",
            f"--sleep={XID_REQUEST}:150"]) as standin:
        # the GPU the server holds open, found as the collector finds it
        topo = events.Topology(host=stamp.host, boot_id=stamp.boot_id, seq=0, ts_ns=time.time_ns(), **host_topology)
        gpus, _ = topology.process_gpus(standin.pid, Path("/proc"), topo)
        assert gpus == [GPU0], "the stand-in holds /dev/nvidia0: the topology's nvidia0"
        summary = standin.run()
        records = polled(signal, published, 2, "the stand-in's two Xid lines")
        wait_until(lambda: len(spans) >= REQUESTS, 30, "the stand-in's spans")
    signal.close()
    pid = standin.pid
    assert sorted((r.xid, r.pci, r.pid) for r in records) == [(74, GPU4, 1), (79, GPU0, pid)]
    window = next(r for r in summary["requests"] if r["request_id"] == f"req-{XID_REQUEST}")
    assert all(window["start_ns"] - 5 * MS <= r.ts_ns <= window["end_ns"] + 5 * MS for r in records)

    process = events.ProcessInfo(host=stamp.host, boot_id=stamp.boot_id, seq=0, ts_ns=time.time_ns(), pid=pid,
                                 comm=PROCESS_NAME.decode(), cmdline="gpu_standin", cgroup="/", cpus_allowed=[0],
                                 gpus=gpus)
    [alert] = [xid_rule.judge(r, State(topo, [process]), Thresholds.defaults(), time.time_ns())
               for r in records if r.xid == 79]
    assert alert.summary.startswith(f"Xid 79 on GPU nvidia0 (0000:03:00.0, node 0), process jsgpuinfer (pid {pid})")

    attributor = Attributor(grace_ns=0, processes=State(topo, [process]))
    for i, s in enumerate(sorted(spans, key=lambda s: s["end_ns"])):
        attributor.add_request(events.RequestSpan(host=stamp.host, boot_id=stamp.boot_id, seq=i, ts_ns=s["end_ns"], **s))
    for r in records:
        attributor.add_evidence(r)
    done = {a.request_id: a for a in attributor.due(time.time_ns() + 1)}
    assert len(done) == REQUESTS
    named = {rid: (a.gpu_xid, a.cause) for rid, a in done.items() if a.gpu_xid}
    assert named == {f"req-{XID_REQUEST}": (79, "gpu_xid")}, named
    hit = done[f"req-{XID_REQUEST}"]
    assert hit.culprit == "Xid 79 on GPU nvidia0: GPU has fallen off the bus: it no longer answers on PCIe"
    print(f"\n[xid] attribution: {hit.request_id} {hit.duration_ns / MS:.1f} ms (baseline {hit.baseline_ns / MS:.1f} "
          f"ms): {hit.cause}, {hit.culprit}; the other {REQUESTS - 1} requests name no Xid")


def test_forged_xid_lines_become_nothing(host_topology):
    marker = f"jsforged{os.getpid()}x{time.time_ns()}"  # no comma: mount splits its options there
    seen: list[bytes] = []

    def read(fd: int, size: int) -> bytes:  # the real records, as they are: only watched
        data = os.read(fd, size)
        seen.append(data)
        return data

    signal, published, _ = opened(host_topology, read)
    try:
        forged = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "unshare", "-Urm", "mount", "-t",
             "tmpfs", "-o", f"NVRM: Xid (PCI:0000:83:00): 79 {marker}", "none", "/mnt"],
            capture_output=True, text=True, timeout=60, cwd="/")
        assert forged.returncode != 0, forged.stderr  # the option is refused, and logged
        kmsg(f"<0>NVRM: Xid (PCI:0000:83:00): 79, pid=1, name=root, GPU has fallen off the bus. {marker}")

        def both_read():
            signal.poll(0)
            return sum(marker.encode() in data for data in seen) >= 2
        wait_until(both_read, 30, "the two forged lines read from the kernel log")
    finally:
        signal.close()
    lines = [data.decode(errors="replace").strip() for data in seen if marker.encode() in data]
    # the kernel did log the mount option, in a kernel-facility line of its own, as the issue says
    assert any(line.split(",", 1)[0].isdigit() and int(line.split(",", 1)[0]) >> 3 == 0
               and "tmpfs: Unknown parameter 'NVRM: Xid (PCI:0000:83:00): 79" in line for line in lines), lines
    assert any(int(line.split(",", 1)[0]) >> 3 == 1 for line in lines), lines  # root's write: facility user
    assert [r for r in published if marker in r.message] == []
    assert signal.refused >= 2 and signal.events_read == 0
    print("\n[xid] refused, as read from /dev/kmsg:\n  " + "\n  ".join(lines))
