# SPDX-License-Identifier: Apache-2.0
"""schemas/events.py's records in schemas/batches.py's NDJSON batches, and
the decoder that keeps bad lines apart."""

from jitterscope.schemas.batches import BadLine, BatchDecoder, encode_batch
from jitterscope.schemas.events import SCHEMA_VERSION, NumaNode, RunqEvent, Topology


def runq(seq: int, **kw) -> RunqEvent:
    fields = dict(host="gpu-a1", boot_id="b0", seq=seq, ts_ns=1_700_000_000_000_000_000 + seq,
                  pid=1234, tid=1240, comm="python3", cpu=2, wait_ns=12_000_000,
                  suspect_pid=4321, suspect_tid=4321, suspect_comm="backup")
    fields.update(kw)
    return RunqEvent(**fields)


def test_encode_is_one_json_object_per_line():
    payload = encode_batch([runq(1), runq(2)])
    lines = payload.split(b"\n")
    assert lines[-1] == b""  # ends with a newline
    assert len(lines) == 3
    assert all(line.startswith(b"{") and line.endswith(b"}") for line in lines[:2])


def test_runq_round_trip():
    records = [runq(1), runq(2, comm="<script>[bold]", wait_ns=1)]
    good, bad = BatchDecoder(RunqEvent).decode(encode_batch(records))
    assert good == records
    assert bad == []
    assert all(r.v == SCHEMA_VERSION for r in good)


def test_topology_with_nested_numa_nodes_round_trips():
    topo = Topology(host="gpu-a1", boot_id="b0", seq=7, ts_ns=5, cpus=list(range(8)),
                    numa_nodes=[NumaNode(0, [0, 1, 2, 3]), NumaNode(1, [4, 5, 6, 7])])
    good, bad = BatchDecoder(Topology).decode(encode_batch([topo]))
    assert bad == []
    assert good == [topo]
    assert isinstance(good[0].numa_nodes[1], NumaNode)
    assert good[0].numa_nodes[1].cpus == [4, 5, 6, 7]


def test_bad_lines_are_reported_and_good_ones_kept_in_order():
    first, second, third = (encode_batch([runq(n)]).rstrip(b"\n") for n in (1, 2, 3))
    v2 = third.replace(b'"v":1', b'"v":2')
    assert v2 != third
    payload = b"\n".join([first, b'{"v":1,"host":', second, v2, encode_batch([runq(4)]).rstrip(b"\n")])

    good, bad = BatchDecoder(RunqEvent).decode(payload)

    assert [r.seq for r in good] == [1, 2, 4]
    assert [b.line for b in bad] == [2, 4]
    assert bad[0].payload == b'{"v":1,"host":'
    assert "version" in bad[1].reason
    assert "v1" in bad[1].reason  # says what this reader knows
    assert bad[1].payload == v2


def test_line_numbers_count_blank_lines():
    good_line = encode_batch([runq(1)]).rstrip(b"\n")
    payload = good_line + b"\n\n" + b"not json" + b"\n"
    good, bad = BatchDecoder(RunqEvent).decode(payload)
    assert [r.seq for r in good] == [1]
    assert bad == [BadLine(3, bad[0].reason, b"not json")]


def test_wrong_type_is_a_bad_line_with_the_field_named():
    line = encode_batch([runq(1)]).rstrip(b"\n").replace(b'"cpu":2', b'"cpu":"two"')
    good, bad = BatchDecoder(RunqEvent).decode(line)
    assert good == []
    assert len(bad) == 1 and bad[0].line == 1
    assert "$.cpu" in bad[0].reason


def test_empty_message_is_one_bad_line_zero():
    for payload in (b"", b"\n\n", b"  \n"):
        good, bad = BatchDecoder(RunqEvent).decode(payload)
        assert good == []
        assert bad == [BadLine(0, "empty message", payload)]


def test_non_utf8_bytes_are_a_bad_line_not_a_crash():
    good_line = encode_batch([runq(1)]).rstrip(b"\n")
    broken = encode_batch([runq(2)]).rstrip(b"\n").replace(b'"comm":"python3"', b'"comm":"py\xff\xfe"')
    garbage = b"\xff\xfe\x00\x80"
    good, bad = BatchDecoder(RunqEvent).decode(b"\n".join([good_line, broken, garbage]))
    assert [r.seq for r in good] == [1]
    assert [b.line for b in bad] == [2, 3]
    assert "UTF-8" in bad[0].reason
    assert bad[0].payload == broken and bad[1].payload == garbage


def test_record_of_another_type_is_rejected():
    topo = Topology(host="h", boot_id="b", seq=1, ts_ns=1, cpus=[0], numa_nodes=[NumaNode(0, [0])])
    good, bad = BatchDecoder(RunqEvent).decode(encode_batch([topo]))
    assert good == []
    assert len(bad) == 1 and bad[0].line == 1


def test_one_record_per_line_is_enforced_on_the_fast_path():
    one, two = encode_batch([runq(1)]).strip(), encode_batch([runq(2)]).strip()
    good, bad = BatchDecoder(RunqEvent).decode(one + b"," + two + b"\n")  # two records on one line
    assert good == [] and [b.line for b in bad] == [1]
    split_at = one.index(b",") + 1
    good, bad = BatchDecoder(RunqEvent).decode(one[:split_at - 1] + b"\n" + one[split_at:] + b"\n")
    assert good == [] and [b.line for b in bad] == [1, 2]  # half a record on each line
