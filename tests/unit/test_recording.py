"""The recording file format (collector/recording.py): round trip, the
collector-facing publisher, and a crash-truncated file reading its prefix."""

from __future__ import annotations

import gzip

import pytest

from jitterscope.collector.recording import (MAGIC, RecordingPublisher, RecordingReader, RecordingWriter,
                                             summarize)
from jitterscope.schemas import events, topics


def runq(seq: int, host: str = "h1") -> events.RunqEvent:
    return events.RunqEvent(host=host, boot_id="b", seq=seq, ts_ns=1_700_000_000_000_000_000 + seq, pid=10,
                            tid=11, comm="vllm", cpu=1, wait_ns=12_000_000, suspect_pid=20, suspect_tid=20,
                            suspect_comm="tar")


def test_round_trip_keeps_topic_key_count_and_payload(tmp_path):
    path = tmp_path / "r.jsrec.gz"
    writer = RecordingWriter(path)
    frames = [(topics.RUNQ, b"h1", 2, events.encode_batch([runq(1), runq(2)])),
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
    decoder = events.BatchDecoder(events.RunqEvent)
    seqs = [r.seq for f in frames for r in decoder.decode(f.payload)[0]]
    assert seqs == list(range(7))
    s = summarize(path)
    assert (s.frames, s.records, s.by_topic, s.hosts, s.truncated) == (3, 7, {topics.RUNQ: 7}, {"h1"}, False)


def test_truncated_file_reads_the_complete_prefix(tmp_path):
    path = tmp_path / "t.jsrec.gz"
    writer = RecordingWriter(path)
    sizes = []
    for i in range(20):
        writer.write([(topics.RUNQ, b"h1", 1, events.encode_batch([runq(i)]))])
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
