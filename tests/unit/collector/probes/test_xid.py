# SPDX-License-Identifier: Apache-2.0
"""The xid probe's pure parts: NVRM Xid lines of every shape seen in the
field parsed (number, PCI address in sysfs form, pid and name where given,
the message), anything else refused without raising, even seeded random
bytes; kmsg records split into sequence, time and message; the follower
carrying on past EPIPE (the ring overwrote what it had not read) and
counting the gap, with a scripted read(2); the log clock's offset from
CLOCK_MONOTONIC read from the scheduler's debug header. Only the driver's
own lines are Xids: a kernel-facility record that starts with the NVRM
prefix; the text quoted inside another kernel line (a tmpfs mount option),
a user-space write (facility user) or a process name are refused and
counted, never published. The real /dev/kmsg, and the real attack as
nobody, are tests/bpf/test_xid.py's."""

from __future__ import annotations

import errno
import random

import pytest

from jitterscope.collector.kmsg import KERNEL, KmsgFollower, clock_offset_ns, parse_record
from jitterscope.collector.probes.interface import ProbeContext
from jitterscope.collector.probes.xid import XidLine, XidSignal, from_driver, parse_xid, pci_address

# Lines as drivers wrote them (from public bug reports and NVIDIA's docs), each with what must come out
REAL = [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
     XidLine(79, "0000:3b:00.0", 1234, "python3", "GPU has fallen off the bus.")),
    ("NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
     "(GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
     XidLine(13, "0000:cb:00.0", 0, "", "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction "
             "Parameter")),
    ("NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH "
     "TIMEOUT, Info 0x58005",
     XidLine(109, "0000:cb:00.0", 1797828, "pt_main_thread", "Ch 00000008, errorString CTX SWITCH TIMEOUT, "
             "Info 0x58005")),
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
     XidLine(63, "0000:10:1c.0", 1896, "", "Row Remapper: New row marked for remapping, reset gpu to activate.")),
    ("NVRM: Xid (PCI:0000:01:00): 31, Ch 00000003, engmask 00000101, intr 10000000",
     XidLine(31, "0000:01:00.0", 0, "", "Ch 00000003, engmask 00000101, intr 10000000")),
    ("NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff",
     XidLine(3, "0000:01:00.0", 0, "", "C 00000005 SC 00000007 M 00001ffc Data ffffffff")),
    ("NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
     XidLine(45, "0000:dc:00.0", 1818990, "python3", "Ch 00000001 caused by previous Xid 149")),
    ("NVRM: Xid (PCI:00000000:3B:00): 48, pid=77, name=tritonserver, An uncorrectable double bit error",
     XidLine(48, "0000:3b:00.0", 77, "tritonserver", "An uncorrectable double bit error")),
    ("NVRM: Xid (PCI:0000:3b:00.0): 119, pid=88, name=vllm", XidLine(119, "0000:3b:00.0", 88, "vllm", "")),
    ("NVRM: Xid (PCI:0000:3b:00): 92", XidLine(92, "0000:3b:00.0", 0, "", "")),
]

NOT_XID = [
    "",
    "NVRM: GPU at PCI:0000:01:00: GPU-5f4e6a0c-...",
    "NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x22:0x56:667)",
    "NVRM: Xid (43, pid: 5678): ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",  # not a driver's shape
    "NVRM: Xid (PCI:0000:3b:00): , pid=1",
    "NVRM: Xid (PCI:0000:3b:00): 99999999, pid=1",
    "NVRM: Xid (PCI:zzzz:3b:00): 79, pid=1",
    "NVRM: Xid (PCI:0000:3b): 79",
    "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context",
    # the kernel quoting a user's words: only the driver's line starts with the prefix
    "tmpfs: Unknown parameter 'NVRM: Xid (PCI:0000:3b:00): 79'",
    " NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
    "NVRM: Xid (PCI[4242]: segfault at 0 ip 0000000000401126 sp 00007ffd error 6 in a.out",  # a 15-char comm
]


@pytest.mark.parametrize("line, expected", REAL, ids=[str(e.xid) for _, e in REAL])
def test_real_lines_parse(line, expected):
    assert parse_xid(line) == expected


@pytest.mark.parametrize("line", NOT_XID)
def test_other_lines_are_not_xids(line):
    assert parse_xid(line) is None


def test_the_pci_address_is_normalised_to_sysfs():
    assert pci_address("0000:3B:00") == pci_address("00000000:3b:00") == pci_address("0000:3b:00.0") == "0000:3b:00.0"
    assert pci_address("0001:c1:00.1") == "0001:c1:00.1"


def test_garbage_never_raises():
    """Seeded mutations of real lines and random bytes: a result or None,
    never an exception, and a result is always well formed."""
    rng = random.Random(19)
    seeds = [line for line, _ in REAL]
    for _ in range(5000):
        line = list(rng.choice(seeds))
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(line) + 1)
            op = rng.random()
            if op < 0.4 and line:
                del line[min(at, len(line) - 1)]
            elif op < 0.8:
                line.insert(at, chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 0x3000)])))
            else:
                line[at:at] = list(rng.choice([",", "pid=", "name=", "):", "PCI:", "'", "<unknown>", "99999"]))
        found = parse_xid("".join(line))
        if found is not None:
            assert 0 <= found.xid <= 0xFFFF and 0 <= found.pid < 2**32
            assert pci_address(found.pci) == found.pci
    for _ in range(2000):
        assert parse_xid(bytes(rng.randrange(256) for _ in range(rng.randrange(80))).decode("latin-1")) is None


def test_kmsg_records():
    assert parse_record(b"4,1061,46942698916,-;NVRM: Xid (PCI:0000:3b:00): 79, x\n SUBSYSTEM=pci\n DEVICE=+pci:0\n") \
        == (1061, 46942698916, 4, "NVRM: Xid (PCI:0000:3b:00): 79, x")
    assert parse_record(b"14,5,7,-,caller=T1;hello") == (5, 7, 14, "hello")
    for bad in (b"", b"no header", b"a,b,c;text", b"1,2;text", b"\xff\xfe;\x00"):
        assert parse_record(bad) is None
    assert parse_record(b"6,1,2,-;caf\xc3\xa9 \xff").message == "caf\u00e9 \ufffd"


# /dev/kmsg records as read(2) returns them: the driver's (facility kernel,
# level warning) and forgeries of it
DRIVER = b"4,1061,46942698916,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"
FORGED = [
    # unshare -Urm mount -t tmpfs -o 'NVRM: Xid (PCI:0000:3b:00): 79' none /mnt, as nobody: as read here
    b"3,364,644558543,-;tmpfs: Unknown parameter 'NVRM: Xid (PCI:0000:3b:00): 79'\n",
    # echo '<3>NVRM: Xid ...' > /dev/kmsg as root: the kernel gives it facility user (1 * 8 + 3)
    b"11,365,644558600,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
    # '<2>' with facility 0 asked for: still user; another facility (daemon) as asked
    b"10,366,644558601,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
    b"27,367,644558602,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
]


def test_only_the_driver_s_kernel_record_is_an_xid():
    record = parse_record(DRIVER)
    assert record.facility == KERNEL and from_driver(record)
    assert parse_xid(record.message) == XidLine(79, "0000:3b:00.0", 1234, "python3", "GPU has fallen off the bus.")
    for forged in FORGED:
        assert not from_driver(parse_record(forged)), forged


class ScriptedRead:
    """read(2) answers in order: bytes, or an errno to raise; then EAGAIN."""

    def __init__(self, answers):
        self.answers = list(answers)

    def __call__(self, fd, size):
        if not self.answers:
            raise BlockingIOError(errno.EAGAIN, "no record")
        answer = self.answers.pop(0)
        if isinstance(answer, int):
            raise OSError(answer, "scripted")
        return answer


def test_the_follower_survives_overwrites_and_counts_them(tmp_path):
    path = tmp_path / "kmsg"
    path.write_bytes(b"old line, never replayed\n")
    follower = KmsgFollower(str(path), read=ScriptedRead([
        b"6,100,1000,-;first", errno.EPIPE, b"6,140,2000,-;after 39 were overwritten", b"garbage",
        errno.EINTR, b"6,141,2001,-;next"]))
    assert [(r.seq, r.message) for r in follower.records()] == [
        (100, "first"), (140, "after 39 were overwritten"), (141, "next")]
    assert (follower.lost, follower.bad) == (39, 1)
    assert follower.records() == []  # EAGAIN: nothing more, no wait
    follower.close()
    follower.close()  # twice is fine
    assert follower.records() == []


def test_the_follower_starts_at_the_end_and_reads_at_most_its_limit(tmp_path):
    path = tmp_path / "kmsg"
    path.write_bytes(b"6,1,1,-;before the follower opened\n")
    follower = KmsgFollower(str(path))  # os.read on a plain file: at its end, nothing (b"")
    assert follower.records() == []
    follower.close()
    many = KmsgFollower(str(path), read=ScriptedRead([f"6,{i},{i},-;line {i}".encode() for i in range(10)]))
    assert [r.seq for r in many.records(limit=4)] == [0, 1, 2, 3]
    assert [r.seq for r in many.records()] == [4, 5, 6, 7, 8, 9]
    many.close()


def test_other_errors_are_raised(tmp_path):
    path = tmp_path / "kmsg"
    path.write_bytes(b"")
    follower = KmsgFollower(str(path), read=ScriptedRead([errno.EIO]))
    with pytest.raises(OSError):
        follower.records()
    follower.close()


def test_the_kernel_log_clock_offset_from_the_scheduler_debug_header(tmp_path):
    debug = tmp_path / "debug"
    debug.write_text("Sched Debug Version: v0.11, 6.18.44 #1\nktime                                   : "
                     "47931854.264965\nsched_clk                               : 47931897.028398\n"
                     "cpu_clk                                 : 47931853.579123\njiffies : 4306875220\n"
                     + "cpu#0, 2445.406 MHz\n" * 500)
    assert clock_offset_ns(debug) == 685_842
    assert clock_offset_ns(tmp_path / "absent") is None
    debug.write_text("ktime : 5.000001\n")  # cpu_clk missing (another kernel's layout)
    assert clock_offset_ns(debug) is None


def test_the_clock_offset_keeps_the_largest_of_its_reads(monkeypatch):
    """A vCPU stopped between the kernel's ktime and cpu_clk reads makes one
    read too small by the stall (an Xid stamped early): the largest counts."""
    from jitterscope.collector import kmsg
    reads = iter([-1_150_000, -6_150_000, -1_149_000, -1_151_000, -3_000_000])
    monkeypatch.setattr(kmsg, "_one_offset_ns", lambda path: next(reads))
    assert clock_offset_ns() == -1_149_000


def test_the_signal_publishes_the_driver_s_line_and_refuses_the_forged(tmp_path):
    path = tmp_path / "kmsg"
    path.write_bytes(b"")
    published = []
    signal = XidSignal(str(path), read=ScriptedRead([*FORGED, DRIVER, *FORGED]))
    context = ProbeContext(settings=None, stamp=None, publish=published.append, describe_process=lambda pid: None,
                           comm_of=lambda pid: "", topology={})
    context.event = lambda kind, ts_ns, **f: (kind.__name__, f)  # the fields, without the agent's stamp
    signal.open(context)
    signal.poll(0)
    signal.close()
    assert [(kind, f["xid"], f["pid"]) for kind, f in published] == [("GpuXid", 79, 1234)]
    assert (signal.refused, signal.unparsed, signal.events_read) == (2 * len(FORGED), 0, 1)
