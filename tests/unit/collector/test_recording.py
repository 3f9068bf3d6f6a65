# SPDX-License-Identifier: Apache-2.0
"""The recording file format (collector/recording.py): round trip, the
collector-facing publisher, and a crash-truncated file reading its prefix."""

from __future__ import annotations

import gzip

import pytest

from jitterscope.collector.recording import (MAGIC, Frame, RecordingPublisher, RecordingReader, RecordingWriter,
                                             summarize)
from jitterscope.schemas import batches, events, topics


def runq(seq: int, host: str = "h1") -> events.RunqEvent:
    return events.RunqEvent(host=host, boot_id="b", seq=seq, ts_ns=1_700_000_000_000_000_000 + seq, pid=10,
                            tid=11, comm="vllm", cpu=1, wait_ns=12_000_000, suspect_pid=20, suspect_tid=20,
                            suspect_comm="tar")


def test_round_trip_keeps_topic_key_count_and_payload(tmp_path):
    path = tmp_path / "r.jsrec.gz"
    writer = RecordingWriter(path)
    frames = [(topics.RUNQ, b"h1", 2, batches.encode_batch([runq(1), runq(2)])),
              (topics.TOPOLOGY, b"h2", 1, b'{"x":1}\n'),
              (topics.RUNQ, b"h1", 0, b"")]
    writer.write(frames[:2])
    writer.write(frames[2:])
    writer.close()
    reader = RecordingReader(path)
    got = [(f.topic, f.key, f.records, f.payload) for f in reader]
    assert got == frames and not reader.truncated
    # plain gzip: zcat shows it
    assert gzip.decompress(path.read_bytes()).startswith(MAGIC)


def test_publisher_splits_like_kafka_and_counts(tmp_path):
    path = tmp_path / "p.jsrec.gz"
    pub = RecordingPublisher(path, "h1", max_message_bytes=10_000, max_records=3)
    pub.check_reachable()
    pub.send(topics.RUNQ, [runq(i) for i in range(7)])
    assert pub.flush() == 0
    pub.close()
    assert pub.records_sent == 7 and pub.sent_by_topic == {topics.RUNQ: 7} and pub.undelivered == 0
    frames = list(RecordingReader(path))
    assert [f.records for f in frames] == [3, 3, 1] and {f.key for f in frames} == {b"h1"}
    decoder = batches.BatchDecoder(events.RunqEvent)
    seqs = [r.seq for f in frames for r in decoder.decode(f.payload)[0]]
    assert seqs == list(range(7))
    s = summarize(path)
    assert (s.frames, s.records, s.by_topic, s.hosts, s.truncated) == (3, 7, {topics.RUNQ: 7}, {"h1"}, False)


def test_truncated_file_reads_the_complete_prefix(tmp_path):
    path = tmp_path / "t.jsrec.gz"
    writer = RecordingWriter(path)
    sizes = []
    for i in range(20):
        writer.write([(topics.RUNQ, b"h1", 1, batches.encode_batch([runq(i)]))])
        sizes.append(writer.bytes_written)
    writer.close()
    data = path.read_bytes()
    # cut at every byte inside the last three members: the earlier frames all come back
    for cut in range(sizes[16], len(data)):
        path.write_bytes(data[:cut])
        reader = RecordingReader(path)
        frames = list(reader)
        whole = sum(1 for size in sizes if size <= cut)
        assert len(frames) >= whole and len(frames) <= 20, cut
        assert reader.truncated == (cut not in sizes), cut
    path.write_bytes(data)
    assert len(list(RecordingReader(path))) == 20


def test_not_a_recording_is_refused(tmp_path):
    from jitterscope.collector.recording import errors

    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(b"hello world, certainly no magic here\n"))
    with pytest.raises(errors.BadConfig, match="not a jitterscope recording"):
        list(RecordingReader(path))


def test_plain_files_are_refused_and_empty_ones_are_truncated(tmp_path):
    from jitterscope.collector.recording import errors

    plain = tmp_path / "plain.txt"
    plain.write_bytes(b"not gzip at all\n")
    with pytest.raises(errors.BadConfig, match="not a jitterscope recording"):
        list(RecordingReader(plain))
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    reader = RecordingReader(empty)
    assert list(reader) == [] and reader.truncated


# -- hostile recordings ------------------------------------------------------

import json  # noqa: E402
import os  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import zlib  # noqa: E402

from jitterscope.collector.recording import MAX_FRAME_BYTES, MAX_HEADER_BYTES, errors  # noqa: E402
from jitterscope.collector.replay import FrameCheck, check_host  # noqa: E402

GIB_MIB = 1024


def gzip_bomb(prefix: bytes, zeros_mib: int) -> bytes:
    """One gzip member: ``prefix`` then ``zeros_mib`` MiB of zeros, valid to
    its CRC (``zcat`` inflates it all), about 1 kB per MiB. After a full
    flush no block refers back, so one compressed MiB repeated is the next."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = compressor.compress(prefix) + compressor.flush(zlib.Z_FULL_FLUSH)
    zeros = bytes(1 << 20)
    block = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    last = compressor.flush()[:-8]  # the final (empty) block; the trailer is recomputed for the whole
    crc = zlib.crc32(prefix)
    for _ in range(zeros_mib):
        crc = zlib.crc32(zeros, crc)
    size = (len(prefix) + (zeros_mib << 20)) & 0xFFFFFFFF
    return head + block * zeros_mib + last + crc.to_bytes(4, "little") + size.to_bytes(4, "little")


def test_the_bomb_builder_makes_real_gzip():
    assert gzip.decompress(gzip_bomb(MAGIC, 3)) == MAGIC + bytes(3 << 20)


# Growth = this process's peak RSS while reading (VmHWM, its high-water mark
# reset first where the kernel allows) less its RSS just before, in KiB.
# (ru_maxrss is no good here: after fork+exec it keeps pytest's own size.)
MEASURE = """
import json, re, sys, time
from jitterscope.collector.recording import RecordingReader, summarize
from jitterscope.common import errors
status = lambda name: int(re.search(name + r":\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
try:
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
except OSError:
    pass
before = status("VmRSS")
started = time.monotonic()
try:
    summarize(sys.argv[1])
    outcome = "accepted"
except errors.BadConfig as exc:
    outcome = str(exc)
print(json.dumps({"growth_kib": status("VmHWM") - before, "error": outcome, "seconds": time.monotonic() - started}))
"""


@pytest.mark.parametrize("prefix", [
    MAGIC,  # 1 GiB of zeros where a frame header should be
    MAGIC + b"jitterscope.runq\th1\t0\t1073741824\n",  # a header claiming 1 GiB, and the GiB
], ids=["zeros", "huge-length"])
def test_a_compression_bomb_is_refused_in_one_line_without_inflating(tmp_path, prefix):
    path = tmp_path / "bomb.jsrec.gz"
    path.write_bytes(gzip_bomb(prefix, GIB_MIB))  # ~1 MB on disk, 1 GiB inflated
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    print(f"bomb {path.stat().st_size:,} bytes ({GIB_MIB} MiB inflated): peak RSS growth "
          f"{measured['growth_kib'] / 1024:.1f} MiB in {measured['seconds']:.2f} s: {measured['error']}")
    assert "is refused" in measured["error"] and "\n" not in measured["error"]
    assert measured["growth_kib"] < 64 * 1024, measured


def test_a_header_claiming_a_huge_frame_is_refused(tmp_path):
    path = tmp_path / "huge.jsrec.gz"
    path.write_bytes(gzip.compress(MAGIC + b"%s\th1\t1\t%d\n{}\n" % (topics.RUNQ.encode(), MAX_FRAME_BYTES + 1)))
    with pytest.raises(errors.BadConfig, match="more than a recording frame may hold"):
        summarize(path)


def test_an_endless_header_is_refused(tmp_path):
    path = tmp_path / "long.jsrec.gz"
    path.write_bytes(gzip.compress(MAGIC + b"x" * (MAX_HEADER_BYTES + 1)))
    with pytest.raises(errors.BadConfig, match=f"header runs past {MAX_HEADER_BYTES} bytes"):
        list(RecordingReader(path))
    path.write_bytes(gzip.compress(MAGIC + b"x" * (MAX_HEADER_BYTES - 10)))  # a header cut by a crash
    reader = RecordingReader(path)
    assert list(reader) == [] and reader.truncated


def test_more_records_than_bytes_or_a_signed_count_is_refused(tmp_path):
    path = tmp_path / "count.jsrec.gz"
    path.write_bytes(gzip.compress(MAGIC + b"%s\th1\t5\t2\n{}" % topics.RUNQ.encode()))
    with pytest.raises(errors.BadConfig, match="5 records in 2 bytes"):
        summarize(path)
    path.write_bytes(gzip.compress(MAGIC + b"%s\th1\t-1\t2\n{}" % topics.RUNQ.encode()))
    reader = RecordingReader(path)
    assert list(reader) == [] and reader.truncated and "bad frame header" in reader.error


def test_a_topic_that_is_not_utf8_is_a_bad_header_not_a_crash(tmp_path):
    path = tmp_path / "bytes.jsrec.gz"
    path.write_bytes(gzip.compress(MAGIC + b"\xff\xfe\th1\t0\t0\n"))
    reader = RecordingReader(path)
    assert list(reader) == [] and reader.truncated and "bad frame header" in reader.error


def test_the_publisher_never_writes_a_frame_a_reader_refuses(tmp_path):
    path = tmp_path / "big.jsrec.gz"
    pub = RecordingPublisher(path, "h1", max_message_bytes=100 * MAX_FRAME_BYTES)
    assert pub.max_message_bytes == MAX_FRAME_BYTES
    big = events.ProcessInfo(host="h1", boot_id="b", seq=1, ts_ns=1_700_000_000_000_000_000, pid=1, comm="x",
                             cmdline="a" * MAX_FRAME_BYTES, cgroup="/", cpus_allowed=[0])
    pub.send(topics.PROCESSES, [big])
    pub.send(topics.RUNQ, [runq(1)])
    pub.close()
    assert pub.undelivered == 1 and pub.sent_by_topic == {topics.RUNQ: 1}
    assert summarize(path).by_topic == {topics.RUNQ: 1}


def processes(host: str, comm: str = "vllm") -> bytes:
    return batches.encode_batch([events.ProcessInfo(host=host, boot_id="b", seq=1, ts_ns=1_700_000_000_000_000_000,
                                                   pid=4242, comm=comm, cmdline="python -m vllm serve",
                                                   cgroup="/", cpus_allowed=[0, 1])])


def test_replay_checks_topic_key_and_every_records_host():
    check = FrameCheck("attacker-host")
    frame = lambda topic, key, payload: Frame(topic, key, payload.count(b"\n"), payload)  # noqa: E731
    assert check.refusal(frame(topics.RUNQ, b"attacker-host", batches.encode_batch([runq(1, "attacker-host")]))) is None
    assert "'payments.transactions' is not one of jitterscope's input topics" in check.refusal(
        frame("payments.transactions", b"attacker-host", b'{"amount": 100}\n'))
    assert "not one of jitterscope's input topics" in check.refusal(frame(topics.ALERTS, b"attacker-host", b"{}\n"))
    forged = check.refusal(frame(topics.PROCESSES, b"attacker-host", processes("victim-host", "evil")))
    assert forged == "keyed for host 'attacker-host' but holding records of host 'victim-host'"
    mixed = batches.encode_batch([runq(1, "attacker-host"), runq(2, "victim-host")])
    assert "'victim-host'" in check.refusal(frame(topics.RUNQ, b"attacker-host", mixed))
    assert check.refusal(frame(topics.PROCESSES, b"victim-host", processes("victim-host"))) == \
        "keyed for host 'victim-host', not 'attacker-host'"
    # undecodable lines pass: the worker dead-letters them under the message key
    assert check.refusal(frame(topics.RUNQ, b"attacker-host", b"not json\n")) is None


def test_replay_wants_an_explicit_host_and_names_the_ones_the_file_holds(tmp_path):
    path = tmp_path / "one.jsrec.gz"
    writer = RecordingWriter(path)
    writer.write([(topics.PROCESSES, b"gpu-7", 1, processes("gpu-7"))])
    writer.close()
    summary = summarize(path)
    needs = "replay needs --host: .* host 'gpu-7'; to replay them, pass --host gpu-7$"
    with pytest.raises(errors.BadConfig, match=needs):
        check_host(summary, None, path)
    with pytest.raises(errors.BadConfig, match="no records of host 'gpu-8'; it holds records of: 'gpu-7'"):
        check_host(summary, "gpu-8", path)
    assert check_host(summary, "gpu-7", path) == "gpu-7"
    writer = RecordingWriter(path)
    writer.write([(topics.RUNQ, b"b\x1b[2J", 0, b""), (topics.RUNQ, b"a", 0, b"")])
    writer.close()
    with pytest.raises(errors.BadConfig, match=r"2 hosts \('a', 'b\\x1b\[2J'\); name the one") as refused:
        check_host(summarize(path), None, path)
    assert "\x1b" not in str(refused.value)


class FakeProducer:
    """confluent_kafka.Producer, as far as replay uses it: every topic exists."""

    produced: list = []

    def __init__(self, config):
        FakeProducer.produced = []
        self._pending = []

    def list_topics(self, timeout):
        return type("Metadata", (), {"topics": dict.fromkeys(topics.ALL_TOPICS)})()

    def produce(self, topic, payload, key, on_delivery):
        FakeProducer.produced.append((topic, key, payload))
        self._pending.append(on_delivery)

    def poll(self, timeout=0):
        for callback in self._pending:
            callback(None, None)
        self._pending = []

    def flush(self, timeout=0):
        self.poll()
        return 0


def test_replay_produces_nothing_for_refused_frames(tmp_path, monkeypatch):
    import confluent_kafka

    from jitterscope.collector.replay import replay

    monkeypatch.setattr(confluent_kafka, "Producer", FakeProducer)
    path = tmp_path / "hostile.jsrec.gz"
    writer = RecordingWriter(path)
    legit = batches.encode_batch([runq(1, "attacker-host")])
    writer.write([(topics.RUNQ, b"attacker-host", 1, legit),
                  ("payments.transactions", b"attacker-host", 1, b'{"amount": 100}\n'),
                  (topics.PROCESSES, b"attacker-host", 1, processes("victim-host", "evil")),
                  (topics.PROCESSES, b"victim-host", 1, processes("victim-host", "evil"))])
    writer.close()
    result = replay(path, "kafka:9092", host="attacker-host")
    assert FakeProducer.produced == [(topics.RUNQ, b"attacker-host", legit)]
    assert (result.messages, result.records, result.by_topic) == (1, 1, {topics.RUNQ: 1})
    assert sum(result.refused.values()) == 3 and result.refused_records == 3
    assert any("payments.transactions" in why for why in result.refused)


# -- files a recording leaves ------------------------------------------------

def test_a_recording_is_private_and_never_written_through_a_symlink(tmp_path):
    path = tmp_path / "new" / "r.jsrec.gz"
    RecordingWriter(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.chmod(0o644)  # one an older version wrote: private again before anything is written
    RecordingWriter(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "link.jsrec.gz"
    link.symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link"):
        RecordingWriter(link)
    publisher = RecordingPublisher(link, "h1")
    with pytest.raises(errors.BadConfig, match=f"cannot write the recording {link}: it is a symbolic link"):
        publisher.check_reachable()
    assert victim.read_text() == "keep me" and stat.S_IMODE(victim.stat().st_mode) != 0 and not os.path.islink(victim)
