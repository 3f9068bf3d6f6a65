# SPDX-License-Identifier: Apache-2.0
"""Each probe's decoding, without a kernel: the raw structs of bpf/*.h built
here from bytes (BCC gives the collector ctypes views of the same layouts),
handed to the probe's decode function, checked field by field against the
values the records carry. Also: the registry, and the values the BPF side
and the Python side must agree on."""

from __future__ import annotations

import ctypes
import re
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from jitterscope.collector.probes import base, blockio, gpu_ioctl, migrate, netdev, pages, registry, runq
from jitterscope.collector.probes.interface import ProbeContext
from jitterscope.common.settings import HARDWARE_PROBES, Settings
from jitterscope.schemas import events

BPF = Path(__file__).resolve().parents[4] / "bpf"
COMM = ctypes.c_char * base.TASK_COMM_LEN


def comm(text: bytes) -> bytes:
    return text.ljust(base.TASK_COMM_LEN, b"\0")


# -- the layouts of bpf/*.h, as BCC's ctypes views have them ---------------------------
class RunqEventStruct(ctypes.Structure):  # struct runq_event
    _fields_ = [("ts_ns", ctypes.c_uint64), ("wait_ns", ctypes.c_uint64), ("pid", ctypes.c_uint32),
                ("tid", ctypes.c_uint32), ("cpu", ctypes.c_uint32), ("suspect_pid", ctypes.c_uint32),
                ("suspect_tid", ctypes.c_uint32), ("waits", ctypes.c_uint32), ("comm", COMM),
                ("suspect_comm", COMM), ("victim_kernel_bytes", ctypes.c_int64),
                ("victim_user_bytes", ctypes.c_int64), ("suspect_kernel_bytes", ctypes.c_int64),
                ("suspect_user_bytes", ctypes.c_int64), ("victim_kernel", ctypes.c_uint64 * 127),
                ("victim_user", ctypes.c_uint64 * 127), ("suspect_kernel", ctypes.c_uint64 * 127),
                ("suspect_user", ctypes.c_uint64 * 127)]
    STACKS = struct.Struct("<4q508Q")  # the stack fields after the comms


NO_STACKS = RunqEventStruct.STACKS.pack(-1, -1, -1, -1, *[0] * 508)


def test_runq_event_carries_the_victims_stack():
    frames = [0xffff1, 0xffff2, 0x401000] + [0] * 124
    raw = struct.pack("<QQ6I16s16s", 1, 2, 3, 4, 0, 0, 0, 7, comm(b"a"), comm(b"b")) + \
        RunqEventStruct.STACKS.pack(16, 8, -14, 24, *frames, *frames, *frames, *frames)
    e = runq.decode_event(RunqEventStruct.from_buffer_copy(raw))
    assert e.waits == 7  # a serving thread's short waits, summed
    assert (e.victim_kernel, e.victim_user) == ((0xffff1, 0xffff2), (0xffff1,))
    assert (e.suspect_kernel, e.suspect_user) == ((), (0xffff1, 0xffff2, 0x401000)), "-EFAULT: none"


class GpuIoctlEventStruct(ctypes.Structure):  # struct gpu_ioctl_event
    _fields_ = [("ts_ns", ctypes.c_uint64), ("latency_ns", ctypes.c_uint64), ("request", ctypes.c_uint64),
                ("ret", ctypes.c_int64), ("pid", ctypes.c_uint32), ("tid", ctypes.c_uint32),
                ("fd", ctypes.c_uint32), ("_pad", ctypes.c_uint32), ("comm", COMM)]


class MigrateCountsStruct(ctypes.Structure):  # struct migrate_counts
    _fields_ = [("migrations", ctypes.c_uint64), ("cross_node", ctypes.c_uint64), ("pid", ctypes.c_uint32),
                ("last_cpu", ctypes.c_uint32), ("exited", ctypes.c_uint32), ("_pad", ctypes.c_uint32),
                ("comm", COMM)]


class PageKeyStruct(ctypes.Structure):  # struct page_key
    _fields_ = [("pid", ctypes.c_uint32), ("node", ctypes.c_uint32)]


class PageCountsStruct(ctypes.Structure):  # struct page_counts
    _fields_ = [("page_cache_pages", ctypes.c_uint64), ("alloc_pages", ctypes.c_uint64), ("comm", COMM)]


class DevStatsStruct(ctypes.Structure):  # struct dev_stats
    _fields_ = [("ios", ctypes.c_uint64), ("bytes", ctypes.c_uint64), ("latency_sum_ns", ctypes.c_uint64),
                ("errors", ctypes.c_uint64), ("max_ns", ctypes.c_uint64 * 2), ("max_epoch", ctypes.c_uint32 * 2)]


def migrate_counts(migrations, cross, pid, last_cpu, exited=0, name=b"worker"):
    return MigrateCountsStruct.from_buffer_copy(
        struct.pack("<QQIIII16s", migrations, cross, pid, last_cpu, exited, 0, comm(name)))


def page_counts(cache, alloc, name=b"reader"):
    return PageCountsStruct.from_buffer_copy(struct.pack("<QQ16s", cache, alloc, comm(name)))


def dev_stats(ios, nbytes, total, errors, max_ns=(0, 0), max_epoch=(0, 0)):
    return DevStatsStruct.from_buffer_copy(
        struct.pack("<QQQQ2Q2I", ios, nbytes, total, errors, *max_ns, *max_epoch))


def fake_context(**kw) -> ProbeContext:
    stamp = SimpleNamespace(header=lambda kind, ts: {"host": "h", "boot_id": "b", "seq": 7, "ts_ns": ts},
                            clock=SimpleNamespace(to_epoch=lambda ns: ns + 1_000))
    published, described = [], []
    ctx = ProbeContext(settings=Settings(host="h"), stamp=stamp, publish=published.append,
                       describe_process=described.append, comm_of=lambda pid: f"p{pid}", **kw)
    ctx.published, ctx.described = published, described
    return ctx


# -- ring-buffer events ------------------------------------------------------------------
def test_runq_event():
    raw = struct.pack("<QQ6I16s16s", 5_000_000_123, 12_000_000, 41, 42, 1, 77, 78, 1,
                      comm(b"python3"), comm(b"stress-ng\xff")) + NO_STACKS
    e = runq.decode_event(RunqEventStruct.from_buffer_copy(raw))
    assert e == runq.RawRunqEvent(ts_ns=5_000_000_123, wait_ns=12_000_000, pid=41, tid=42, cpu=1,
                                     suspect_pid=77, suspect_tid=78, comm="python3",
                                     suspect_comm="stress-ng\ufffd")


def test_runq_comm_of_full_length_and_garbage_after_the_nul():
    raw = struct.pack("<QQ6I16s16s", 1, 2, 3, 4, 0, 0, 0, 0, b"fifteen-chars-x\0",
                      b"ab\0junk".ljust(16, b"z")) + NO_STACKS
    e = runq.decode_event(RunqEventStruct.from_buffer_copy(raw))
    assert (e.comm, e.suspect_comm) == ("fifteen-chars-x", "ab")


def test_runq_event_becomes_a_record_with_the_process_described(tmp_path):
    signal = runq.RunqSignal()
    signal.ctx = fake_context(proc=tmp_path)
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "status").write_text("Name:\tx\nTgid:\t40\n")
    signal.on_event(runq.RawRunqEvent(100, 9_000_000, 0, 43, 1, 77, 78, "w", "s"))
    [record] = signal.ctx.published
    assert isinstance(record, events.RunqEvent)
    assert (record.ts_ns, record.pid, record.tid, record.wait_ns, record.suspect_pid) == (1_100, 40, 43, 9_000_000, 77)
    assert signal.ctx.described == [40, 77] and signal.events_read == 1


def test_gpu_ioctl_event():
    raw = struct.pack("<QQQq4I16s", 9_000, 60_000_000, 0xC0_20_46_2A, -25, 300, 301, 7, 0, comm(b"vllm"))
    e = gpu_ioctl.decode_event(GpuIoctlEventStruct.from_buffer_copy(raw))
    assert e == gpu_ioctl.RawGpuIoctl(ts_ns=9_000, latency_ns=60_000_000, pid=300, tid=301, comm="vllm",
                                     fd=7, request=0xC020462A, ret=-25)


def test_gpu_ioctl_event_record_carries_the_device_of_its_fd():
    signal = gpu_ioctl.GpuIoctlSignal()
    signal.ctx = fake_context()
    signal._devices = {(300, 7): "/dev/nvidia0"}
    signal.on_event(gpu_ioctl.RawGpuIoctl(9_000, 60_000_000, 300, 301, "vllm", 7, 1, 0))
    signal.on_event(gpu_ioctl.RawGpuIoctl(9_001, 1, 300, 301, "vllm", 8, 1, 0))
    first, second = signal.ctx.published
    assert (first.device, first.ts_ns, first.latency_ns, first.fd) == ("/dev/nvidia0", 10_000, 60_000_000, 7)
    assert second.device == ""


# -- counters read from maps --------------------------------------------------------------
def test_migration_counts_as_deltas(tmp_path):
    k1, k2 = ctypes.c_uint32(11), ctypes.c_uint32(12)
    first, seen, gone = migrate.diff_counts(
        [(k1, migrate_counts(5, 2, 10, 1)), (k2, migrate_counts(3, 0, 10, 0))], {}, tmp_path)
    assert first == {11: migrate.RawMigrations(10, 11, "worker", 5, 2, 1),
                     12: migrate.RawMigrations(10, 12, "worker", 3, 0, 0)}
    assert seen == {11: (5, 2), 12: (3, 0)} and gone == []

    # 11 moved twice more (one across nodes); 12 did not move; 11 then exits
    second, seen, gone = migrate.diff_counts(
        [(k1, migrate_counts(7, 3, 10, 0, exited=1)), (k2, migrate_counts(3, 0, 10, 0))], seen, tmp_path)
    assert second == {11: migrate.RawMigrations(10, 11, "worker", 2, 1, 0)}
    assert gone == [k1] and seen == {12: (3, 0)}


def test_migration_counts_restarted_entry_and_unknown_thread(tmp_path):
    (tmp_path / "21").mkdir()
    (tmp_path / "21" / "comm").write_text("late\n")
    (tmp_path / "21" / "status").write_text("Name:\tlate\nTgid:\t20\n")
    key = ctypes.c_uint32(21)
    # fewer than seen: the entry was deleted and started again; pid 0: from /proc
    result, _, _ = migrate.diff_counts([(key, migrate_counts(2, 1, 0, 3, name=b""))], {21: (9, 4)}, tmp_path)
    assert result == {21: migrate.RawMigrations(20, 21, "late", 2, 1, 3)}


def test_migration_records(tmp_path):
    signal = migrate.MigrateSignal()
    signal.ctx = fake_context()
    signal.probe = SimpleNamespace(read_counts=lambda: {11: migrate.RawMigrations(10, 11, "w", 5, 2, 1)})
    [record] = signal.periodic(1_000, 5_000)
    assert isinstance(record, events.Migrations) and record.ts_ns == 5_000
    assert (record.pid, record.tid, record.migrations, record.cross_node, record.last_cpu) == (10, 11, 5, 2, 1)
    assert signal.ctx.described == [10]


def test_page_counts_as_deltas():
    a0, a1 = PageKeyStruct(100, 0), PageKeyStruct(100, base.UNKNOWN_NODE)
    b0 = PageKeyStruct(200, 0)
    comm_of = {100: "reader"}.get
    first, seen, stale = pages.diff_counts(
        [(a0, page_counts(300, 10)), (a1, page_counts(5, 0)), (b0, page_counts(0, 400, b"gone"))],
        {}, set(), lambda pid: comm_of(pid, ""))
    assert first[(100, 0)] == pages.RawPagePlacement(100, 0, "reader", 300, 10)
    assert first[(100, base.UNKNOWN_NODE)].page_cache_pages == 5
    assert first[(200, 0)].comm == "gone", "an exited process keeps the kernel's name"
    assert stale == []

    second, seen, stale = pages.diff_counts(
        [(a0, page_counts(300, 10)), (b0, page_counts(0, 450))], seen, {200}, lambda pid: "")
    assert second == {(200, 0): pages.RawPagePlacement(200, 0, "reader", 0, 50, exited=True)}
    assert stale == [b0] and (200, 0) not in seen

    # an exit with nothing added since: still a delta, that says it exited
    a_gone, _, stale = pages.diff_counts([(a0, page_counts(300, 10))], seen, {100}, lambda pid: "")
    assert a_gone == {(100, 0): pages.RawPagePlacement(100, 0, "reader", 0, 0, exited=True)} and stale == [a0]


def test_page_records_skip_small_activity_and_map_the_unknown_node():
    signal = pages.PagesSignal()
    signal.ctx = fake_context()
    signal.probe = SimpleNamespace(read=lambda: {
        (100, 0): pages.RawPagePlacement(100, 0, "r", 200, pages.MIN_PAGES - 200),
        (100, base.UNKNOWN_NODE): pages.RawPagePlacement(100, base.UNKNOWN_NODE, "r", pages.MIN_PAGES, 0),
        (200, 0): pages.RawPagePlacement(200, 0, "q", 1, pages.MIN_PAGES - 2)})
    records = signal.periodic(1_000, 5_000)
    assert [(r.pid, r.node) for r in records] == [(100, 0), (100, -1)]
    assert all(isinstance(r, events.PagePlacement) for r in records)


def test_the_last_page_record_of_a_reported_process_says_it_exited():
    signal = pages.PagesSignal()
    signal.ctx = fake_context()
    reads = iter([{(100, 0): pages.RawPagePlacement(100, 0, "archiver", 0, pages.MIN_PAGES)},
                  {(100, 0): pages.RawPagePlacement(100, 0, "archiver", 0, 0, exited=True),
                   (200, 0): pages.RawPagePlacement(200, 0, "sh", 0, 3, exited=True)}])  # never reported: no record
    signal.probe = SimpleNamespace(read=lambda: next(reads))
    assert [(r.pid, r.exited) for r in signal.periodic(1_000, 5_000)] == [(100, False)]
    assert [(r.pid, r.exited, r.alloc_pages) for r in signal.periodic(1_000, 6_000)] == [(100, True, 0)]
    assert signal.reported == set() and signal.ctx.described == [100]


def test_block_io_stats_per_device():
    dev = (259 << blockio.MINOR_BITS) | 0
    closing = 5  # slot 1
    per_cpu = [dev_stats(10, 40960, 1_000_000, 0, max_ns=(999_999, 300_000), max_epoch=(4, 5)),
               dev_stats(5, 20480, 600_000, 1, max_ns=(0, 900_000), max_epoch=(0, 3))]  # a stale max
    result, seen = blockio.diff_stats([(ctypes.c_uint32(dev), per_cpu)], {}, closing)
    assert result == {(259, 0): blockio.RawBlockIo(259, 0, 15, 61440, 1_600_000, 300_000, 1)}
    again, _ = blockio.diff_stats([(ctypes.c_uint32(dev), per_cpu)], seen, closing + 1)
    assert again == {}, "idle devices are left out"


def test_block_io_records(tmp_path):
    disk = tmp_path / "devices/pci0000:00/0000:00:05.0/virtio2/block/vda"
    disk.mkdir(parents=True)
    (disk / "uevent").write_text("MAJOR=254\nMINOR=0\nDEVNAME=vda\n")
    (tmp_path / "dev/block").mkdir(parents=True)
    (tmp_path / "dev/block/254:0").symlink_to(disk)
    (disk / "device").symlink_to(disk.parent.parent)
    signal = blockio.BlockIoSignal()
    signal.ctx = fake_context(sys=tmp_path)
    signal.probe = SimpleNamespace(read=lambda: {(254, 0): blockio.RawBlockIo(254, 0, 15, 61440, 1_600_000, 300_000, 1)})
    [record] = signal.periodic(1_000, 5_000)
    assert isinstance(record, events.DeviceIo)
    assert (record.device, record.kind, record.pci, record.ios, record.bytes, record.latency_max_ns,
            record.latency_sum_ns) == ("vda", "block", "0000:00:05.0", 15, 61440, 300_000, 1_600_000)


def test_netdev_counters(tmp_path):
    def write(iface, rx, tx, rxp, txp, device=True):
        stats = tmp_path / "class/net" / iface / "statistics"
        stats.mkdir(parents=True, exist_ok=True)
        for name, value in (("rx_bytes", rx), ("tx_bytes", tx), ("rx_packets", rxp), ("tx_packets", txp)):
            (stats / name).write_text(f"{value}\n")
        if device and not (tmp_path / "class/net" / iface / "device").exists():
            pci = tmp_path / "devices/pci0000:00/0000:00:03.0/virtio0"
            pci.mkdir(parents=True, exist_ok=True)
            (tmp_path / "class/net" / iface / "device").symlink_to(pci)

    write("eth0", 100, 50, 3, 2)
    write("lo", 1, 1, 1, 1, device=False)
    signal = netdev.NetdevSignal()
    signal.open(fake_context(sys=tmp_path))  # the baseline
    write("eth0", 1100, 250, 13, 4)
    write("lo", 9, 9, 9, 9, device=False)
    [record] = signal.periodic(1_000, 5_000)
    assert (record.device, record.kind, record.pci, record.ios, record.bytes) == ("eth0", "net", "0000:00:03.0", 12, 1200)
    assert signal.periodic(1_000, 6_000) == [], "an idle interface makes no record"


def test_histogram_records():
    ctx = fake_context()
    [h1, h2] = ctx.histograms("runq", {9: {3: 1}, 4: {5: 2, 1: 7}}, 10_000, 5_000)
    assert (h1.pid, h1.comm, h1.slots, h1.counts, h1.probe, h1.ts_ns) == (4, "p4", [1, 5], [7, 2], "runq", 5_000)
    assert (h2.pid, h2.slots, h2.counts, h2.interval_ns) == (9, [3], [1], 10_000)


# -- one source per value -----------------------------------------------------------------
def header_defines(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^#define[ \t]+(\w+)[ \t]+(\S+)", path.read_text(), flags=re.M))


def test_shared_bpf_values_have_one_definition_and_python_agrees():
    common = header_defines(BPF / "common.h")
    assert int(common["TASK_COMM_LEN"]) == base.TASK_COMM_LEN
    assert int(common["UNKNOWN_NODE"]) == base.UNKNOWN_NODE
    for path in sorted(BPF.glob("*.[hc]")):
        if path.name != "common.h":
            assert {"TASK_COMM_LEN", "UNKNOWN_NODE"}.isdisjoint(header_defines(path)), path.name
    assert pages.UNKNOWN_NODE is migrate.UNKNOWN_NODE is base.UNKNOWN_NODE


def test_gpu_patterns_default_is_the_setting():
    assert list(gpu_ioctl.DEFAULT_PATTERNS) == Settings(host="h").gpu_device_patterns


# -- the registry -------------------------------------------------------------------------
def test_registry_names_are_the_setting_values():
    assert set(registry.PROBES) == {"runq", *HARDWARE_PROBES}
    for name, factory in registry.PROBES.items():
        probe = factory()
        assert probe.name == name and probe.publishes
        assert (probe.drops(), probe.map_full_drops(), probe.bcc_probes()) == (0, 0, [])
        probe.close()  # unopened: nothing to do


@pytest.mark.parametrize("hardware, expected", [
    ([], ["runq"]),
    (["netdev", "migrate"], ["runq", "migrate", "netdev"]),
    (list(HARDWARE_PROBES), ["runq", *HARDWARE_PROBES]),
])
def test_enabled_probes(hardware, expected):
    assert registry.enabled(Settings(host="h", hardware_probes=hardware)) == expected


def test_jitterscopes_own_waits_are_dropped_and_its_processes_labelled_as_suspects(tmp_path):
    """Its broker, worker and collector were the victim or the culprit of
    half of a first hour's alerts; the report then said "move python off
    the inference CPUs" about the collector."""
    signal = runq.RunqSignal()
    signal.ctx = fake_context(proc=tmp_path, own={500: "broker", 501: "worker"})
    signal.on_event(runq.RawRunqEvent(100, 9_000_000, 500, 500, 1, 77, 78, "tokio-rt-worker", "jshog"))
    assert signal.ctx.published == [] and signal.own_skipped == 1 and signal.ctx.described == []
    signal.on_event(runq.RawRunqEvent(200, 9_000_000, 40, 40, 1, 501, 502, "jsvictim", "python"))
    signal.on_event(runq.RawRunqEvent(300, 9_000_000, 40, 40, 1, 77, 78, "jsvictim", "jshog"))
    # named by its role, not its thread's name ("python" said nothing about what to tune)
    assert [r.suspect_comm for r in signal.ctx.published] == ["jitterscope:worker", "jshog"]
    assert [r.suspect_own for r in signal.ctx.published] == [True, False]
    assert signal.events_read == 3
    assert signal.behind_own == {"waits": 1, "longest_wait_ns": 9_000_000}  # the cost of watching, for doctor


def test_a_foreign_process_named_like_jitterscope_is_not_labelled_its_own(tmp_path):
    """Own is by pid: a foreign ``jitterscope:up`` (``cp /bin/yes``) is no
    own process, and its name is marked so the label stays unforgeable where
    only names are kept (the runq_minute rollup; issue 40, 8)."""
    signal = runq.RunqSignal()
    signal.ctx = fake_context(proc=tmp_path, own={500: "up"})
    signal.on_event(runq.RawRunqEvent(100, 9_000_000, 40, 40, 1, 77, 77, "jsvictim", "jitterscope:up"))
    signal.on_event(runq.RawRunqEvent(200, 9_000_000, 40, 40, 1, 500, 500, "jsvictim", "python"))
    got = [(r.suspect_comm, r.suspect_own) for r in signal.ctx.published]
    assert got == [("?jitterscope:up", False), ("jitterscope:up", True)]


def test_a_process_that_exited_keeps_the_name_last_read_not_the_one_before_its_exec(tmp_path):
    """Its final page counts are read after it exited: the name it had when
    last read, not the kernel entry's (the thread that created it, before exec)."""
    probe = pages.PageProbe.__new__(pages.PageProbe)  # the name look-up alone: no BPF program
    probe._proc, probe._names = tmp_path, {}
    (tmp_path / "42").mkdir()
    (tmp_path / "42/comm").write_text("jspages\n")
    assert probe._comm(42) == "jspages"
    (tmp_path / "42/comm").unlink()  # exited
    assert probe._comm(42) == "jspages"
    assert probe._comm(42) == ""  # asked once more: unknown (the caller falls back to the kernel's)


def test_an_unreadable_loss_counter_reports_its_last_value_and_never_stops_the_collector(caplog):
    from jitterscope.collector.probes.base import BccProbe

    class Counters:
        refuse = False

        def __getitem__(self, key):
            if self.refuse:
                raise KeyError  # what BCC raises when the kernel refuses a map read
            return [3, 4]  # per CPU

    class Loaded(BccProbe):
        source = "test.bpf.c"

        def __init__(self):
            self._bpf = {b"drops": Counters()}

    probe = Loaded()
    assert probe.drops() == 7 and probe.map_full_drops() == 7
    probe._bpf[b"drops"].refuse = True
    assert probe.drops() == 7 and probe.map_full_drops() == 7  # the last values
    assert len([r for r in caplog.records if "unreadable" in r.getMessage()]) == 1  # said once
