# SPDX-License-Identifier: Apache-2.0
"""The hardware sources end to end on this machine's kernel: GPU driver call
latency on a configured device path (here /dev/zero: this machine has no GPU,
and the probe only cares about the path), CPU migrations of a thread whose
affinity keeps changing, page-cache placement of a process reading a
large file, and an NVRM Xid line written into the kernel log: kernel ->
Kafka -> streams -> ClickHouse, and alerts."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import termios
import threading
import time

import pytest

from tests.conftest import wait_until
from tests.gpu_standin import driver_log_env

pytestmark = [pytest.mark.bpf, pytest.mark.integration]

IOCTLS = 200
DRIVER_MARK = f"jsdriver-{os.getpid()}"  # this test's kernel-log lines, read as the driver's


@pytest.fixture(scope="module")
def pipeline(stack):
    # tiny thresholds: the real rule thresholds are unit-tested on a fixture
    # topology; here every /dev/zero ioctl is a "stall" so the plumbing shows
    worker = stack.start_worker_with(JITTERSCOPE_GPU_IOCTL_ALERT_MS="0.000001",
                                     JITTERSCOPE_MIGRATION_STORM_PER_S="5")
    collector = stack.start_collector(
        JITTERSCOPE_GPU_DEVICE_PATTERNS='["/dev/zero"]', JITTERSCOPE_GPU_IOCTL_THRESHOLD_MS="0.000001",
        JITTERSCOPE_TARGET_RESCAN_S="0.2", JITTERSCOPE_HISTOGRAM_INTERVAL_S="1", **driver_log_env(DRIVER_MARK))
    yield stack, worker, collector


def count_ioctls(stack) -> int:
    return stack.query("SELECT count() FROM jitterscope.gpu_ioctls FINAL WHERE pid = {pid:UInt32}",
                       pid=os.getpid())[0][0]


def test_gpu_driver_calls_on_the_configured_device_only(pipeline):
    stack, worker, collector = pipeline
    zero = os.open("/dev/zero", os.O_RDONLY)
    other = os.open("/dev/null", os.O_RDONLY)
    time.sleep(1.0)  # the collector finds the new fd at its next rescan
    for _ in range(IOCTLS):
        for fd in (zero, other):
            try:
                fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
            except OSError:
                pass  # ENOTTY: still a driver call, still timed
    wait_until(lambda: count_ioctls(stack) >= IOCTLS, 60, "the ioctls in ClickHouse", worker)
    [(count, fds, device, fastest)] = stack.query(
        "SELECT count(), uniqExact(fd), any(device), min(latency_ns) FROM jitterscope.gpu_ioctls FINAL "
        "WHERE pid = {pid:UInt32}", pid=os.getpid())
    assert (count, fds, device) == (IOCTLS, 1, "/dev/zero") and fastest > 0
    alerts = wait_until(lambda: stack.query(
        "SELECT count() FROM jitterscope.alerts WHERE kind = 'gpu_ioctl_stall' AND pid = {pid:UInt32}",
        pid=os.getpid())[0][0], 30, "gpu_ioctl_stall alerts", worker)
    assert alerts == IOCTLS
    histogram = wait_until(lambda: stack.query(
        "SELECT sum(arraySum(counts)) FROM jitterscope.latency_histograms WHERE probe = 'gpu_ioctl' "
        "AND pid = {pid:UInt32}", pid=os.getpid())[0][0], 30, "the ioctl histogram", worker)
    assert histogram == IOCTLS

    # The fd number is closed and reused before the collector's next rescan:
    # those calls are not GPU calls and must not be reported.
    os.close(zero)
    reused = socket.socket()
    assert reused.fileno() == zero
    for _ in range(20):
        reused.setblocking(False)  # ioctl(FIONBIO)
        reused.setblocking(True)
    reused.close()
    os.close(other)
    time.sleep(2.0)
    assert count_ioctls(stack) == IOCTLS


def test_migrations_of_a_hopping_thread(pipeline):
    stack, worker, collector = pipeline
    cpus = sorted(os.sched_getaffinity(0) | {max(os.sched_getaffinity(0)) + 1}) if len(os.sched_getaffinity(0)) == 1 \
        else sorted(os.sched_getaffinity(0))
    done = threading.Event()
    tid_box = []

    def hop():
        tid_box.append(threading.get_native_id())
        for i in range(200):
            os.sched_setaffinity(0, {cpus[i % 2]})
            end = time.perf_counter() + 0.002
            while time.perf_counter() < end:
                pass
        done.set()

    thread = threading.Thread(target=hop)
    thread.start()
    thread.join(60)
    tid = tid_box[0]
    # counts are published per interval: wait for the whole hop, not the first interval's share
    moved = wait_until(lambda: (n := stack.query(
        "SELECT sum(migrations) FROM jitterscope.migrations FINAL WHERE tid = {tid:UInt32}", tid=tid)[0][0])
        >= 100 and n, 60, "100 migrations of the hopping thread", worker)
    assert moved >= 100
    storm = wait_until(lambda: stack.query(
        "SELECT summary, remedy FROM jitterscope.alerts WHERE kind = 'migration_storm' AND tid = {tid:UInt32}",
        tid=tid), 30, "a migration_storm alert", worker)
    assert f"thread {tid}" in storm[0][0] and "taskset -pc" in storm[0][1]


def test_page_cache_placement_of_a_reader(pipeline, tmp_path):
    stack, worker, collector = pipeline
    data = tmp_path / "big.bin"
    with open(data, "wb") as f:
        f.write(os.urandom(1 << 20) * 48)  # 48 MiB
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(data, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # drop it: the reader must bring it back
    os.close(fd)
    reader = subprocess.run([sys.executable, "-c", f"open({str(data)!r}, 'rb').read()"], check=True)
    pid_rows = wait_until(lambda: stack.query(
        "SELECT pid, node, sum(page_cache_pages) AS pages FROM jitterscope.page_placement FINAL "
        "WHERE comm LIKE 'python%' GROUP BY pid, node HAVING pages >= 10000"), 60, "the reader's pages", worker)
    assert any(node == 0 and pages >= 0.8 * 48 * 256 for _pid, node, pages in pid_rows), pid_rows
    assert reader.returncode == 0


def test_xid_lines_in_the_kernel_log_reach_clickhouse_and_alert(pipeline):
    """A real NVRM Xid line written into /dev/kmsg: the collector's xid probe
    -> Kafka -> the worker -> the gpu_xid table and an ``xid`` alert with
    NVIDIA's meaning. This host has no GPU, so the alert says the address is
    not in its topology; the mapping to a GPU is tests/bpf/test_xid.py's, on
    a fixture topology."""
    stack, worker, collector = pipeline
    marker = f"jitterscope-integration-{os.getpid()}-{time.time_ns()} {DRIVER_MARK}"  # read as the driver's
    with open("/dev/kmsg", "w") as log:
        log.write(f"<3>NVRM: Xid (PCI:0000:3b:00): 48, pid={os.getpid()}, name=pytest, {marker}\n")
    rows = wait_until(lambda: stack.query(
        "SELECT xid, pci, gpu, pid, comm FROM jitterscope.gpu_xid FINAL WHERE message = {m:String}", m=marker),
        60, "the Xid in ClickHouse", worker)
    assert rows == [[48, "0000:3b:00.0", "", os.getpid(), "pytest"]]
    [[summary, severity, remedy]] = wait_until(lambda: stack.query(
        "SELECT summary, severity, remedy FROM jitterscope.alerts WHERE kind = 'xid' AND evidence['message'] = "
        "{m:String}", m=marker), 30, "the xid alert", worker)
    assert summary.startswith(f"Xid 48 on the GPU at 0000:3b:00.0 (not in this host's topology), process pytest "
                              f"(pid {os.getpid()}): double-bit ECC error")
    assert severity == "critical" and "reset" in remedy


def test_nvml_telemetry_reaches_clickhouse_and_alerts(pipeline, tmp_path):
    """The nvml signal's plumbing in a real collector, with the pynvml
    stand-in of tests/fixtures/nvml_standin first on its path (no GPU
    here): a reading every nvml_interval_s on the sampler thread -> Kafka ->
    the gpu_telemetry table (throttle names in an array column) and a
    ``gpu_throttle`` alert. NVML itself is not exercised: docs/hardware.md."""
    stack, worker, _ = pipeline
    host = f"nvml-{os.getpid()}"
    fixture = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "nvml_standin")
    collector = stack.spawn("collector-nvml", "collector", JITTERSCOPE_HOST=host, JITTERSCOPE_DATA_DIR=str(tmp_path),
                            JITTERSCOPE_HARDWARE_PROBES='["nvml"]', JITTERSCOPE_NVML_INTERVAL_S="0.2",
                            JITTERSCOPE_TARGET_COMMS='["no-such-process"]',
                            PYTHONPATH=os.pathsep.join([fixture, os.environ.get("PYTHONPATH", "")]))
    try:
        rows = wait_until(lambda: (r := stack.query(
            "SELECT pci, gpu, sm_clock_mhz, sm_clock_max_mhz, mem_clock_mhz, throttle_reasons, throttle, "
            "temperature_c, power_mw, pcie_tx_kbps, pcie_rx_kbps, nvlink_errors, interval_ns "
            "FROM jitterscope.gpu_telemetry FINAL WHERE host = {h:String} ORDER BY ts", h=host)) and len(r) >= 5 and r,
            90, "five NVML readings in ClickHouse", collector)
        assert {(*r[:6], tuple(r[6]), *r[7:11]) for r in rows} == {("0000:3b:00.0", "0", 705, 1410, 1215, 0x44,
                                                  ("sw_power_cap", "hw_thermal_slowdown"), 91, 250_000, 1200, 3400)}
        assert all(r[11] == 8 for r in rows), "2 links x 4 counters, each one more per reading"
        assert all(0 < r[12] <= 2_000_000_000 for r in rows), [r[12] for r in rows]
        [[summary, severity]] = wait_until(lambda: stack.query(
            "SELECT summary, severity FROM jitterscope.alerts WHERE kind = 'gpu_throttle' AND host = {h:String}",
            h=host), 30, "one gpu_throttle alert (its repeats folded)", worker)
        assert summary == ("GPU 0 (0000:3b:00.0) clocked down: sw_power_cap, hw_thermal_slowdown "
                           "(SM 705 MHz of 1410, 91 C, 250 W)") and severity == "critical"
        assert "NVML telemetry off" not in collector.text()
    finally:
        collector.stop()
