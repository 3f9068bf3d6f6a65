# SPDX-License-Identifier: Apache-2.0
"""The pieces that issue record keys and remember hosts: Stamp (host,
boot_id, seq never repeat across collector restarts), HostState (the
per-host look-ups the rules use) and the sink's retry policy."""

from __future__ import annotations

import asyncio

import pytest
from clickhouse_connect.driver.exceptions import OperationalError

from jitterscope.collector import agent
from jitterscope.schemas import events
from jitterscope.streams.host_state import HostState
from jitterscope.streams.sink import ClickHouseSink


def fake_proc(tmp_path, boot="boot-a"):
    (tmp_path / "sys/kernel/random").mkdir(parents=True)
    (tmp_path / "sys/kernel/random/boot_id").write_text(boot + "\n")
    return tmp_path


def test_sequences_count_per_record_type_from_the_start_time(tmp_path, monkeypatch):
    monkeypatch.setattr(agent.time, "monotonic_ns", lambda: 5_000_000_000)
    stamp = agent.Stamp("h1", fake_proc(tmp_path))
    runq = [stamp.header(events.RunqEvent, 1)["seq"] for _ in range(3)]
    stats = [stamp.header(events.CollectorStats, 1)["seq"] for _ in range(2)]
    assert runq == [5_000_000, 5_000_001, 5_000_002] and stats == [5_000_000, 5_000_001]
    assert stamp.header(events.RunqEvent, 7) == {"host": "h1", "boot_id": "boot-a", "seq": 5_000_003, "ts_ns": 7}


def test_a_restarted_collector_never_reuses_a_key(tmp_path, monkeypatch):
    """The next run starts at its start time in microseconds since boot: above
    every key of the previous run as long as a run issues fewer records of a
    type than microseconds pass (a million a second)."""
    proc = fake_proc(tmp_path)
    clock = {"ns": 10_000_000_000}
    monkeypatch.setattr(agent.time, "monotonic_ns", lambda: clock["ns"])
    first = agent.Stamp("h1", proc)
    first_keys = {first.header(events.RunqEvent, 0)["seq"] for _ in range(200_000)}  # 200k records...
    clock["ns"] += 1_000_000_000  # ...in one second, then a crash and a restart
    second = agent.Stamp("h1", proc)
    second_keys = {second.header(events.RunqEvent, 0)["seq"] for _ in range(1000)}
    assert not first_keys & second_keys
    assert min(second_keys) > max(first_keys)


def process(host: str, pid: int, comm: str, gpus=()) -> events.ProcessInfo:
    return events.ProcessInfo(host=host, boot_id="b", seq=pid, ts_ns=1, pid=pid, comm=comm, cmdline=comm,
                              cgroup="/", cpus_allowed=[0, 1], gpus=list(gpus))


def test_host_state_keeps_each_hosts_latest_records_apart():
    state = HostState()
    state.learn(events.Topology(host="h1", boot_id="b", seq=1, ts_ns=1, cpus=[0, 1], numa_nodes=[]))
    state.learn(events.Topology(host="h1", boot_id="b", seq=2, ts_ns=2, cpus=[0, 1, 2, 3], numa_nodes=[]))
    state.learn(process("h1", 10, "vllm", ["0000:3b:00.0"]))
    state.learn(process("h1", 11, "backup", ["0000:3b:00.0"]))
    state.learn(process("h2", 10, "other", ["0000:3b:00.0"]))
    state.learn(events.DeviceIo(host="h1", boot_id="b", seq=1, ts_ns=1, device="nvme0n1", kind="block",
                                pci="0000:3c:00.0", interval_ns=1, ios=5, bytes=4096))
    assert state.host_cpus("h1") == [0, 1, 2, 3] and state.host_cpus("h3") is None
    assert state.gpu_users("h1") == {"0000:3b:00.0": ["vllm", "backup"]}
    assert state.gpu_users("h2") == {"0000:3b:00.0": ["other"]}
    assert list(state.host_traffic("h1")) == ["0000:3c:00.0"] and state.host_traffic("h2") == {}


def test_host_state_waits_briefly_for_a_process_record_that_is_on_its_way():
    state = HostState()

    async def scenario():
        late = asyncio.get_running_loop().call_later(0.1, state.learn, process("h1", 42, "vllm"))
        found = await state.process("h1", 42, wait_s=5)
        missing = await state.process("h1", 43, wait_s=0.2)
        late.cancel()
        return found, missing

    found, missing = asyncio.run(scenario())
    assert found.comm == "vllm" and missing is None


class FlakyClient:
    """A ClickHouse client whose first inserts fail the given way."""

    def __init__(self, *failures: Exception):
        self.failures = list(failures)
        self.inserted = 0

    def insert(self, table, data, column_names, column_oriented):
        if self.failures:
            raise self.failures.pop(0)
        self.inserted += len(data[0])


def runq(seq: int) -> events.RunqEvent:
    return events.RunqEvent(host="h", boot_id="b", seq=seq, ts_ns=1, pid=1, tid=1, comm="x", cpu=0, wait_ns=1,
                            suspect_pid=0, suspect_tid=0, suspect_comm="")


def test_the_sink_waits_out_an_unreachable_server_and_raises_data_errors_at_once():
    client = FlakyClient(OperationalError("connection refused"), OperationalError("connection refused"))
    sink = ClickHouseSink(client, retry_delay_s=0.01)
    # a table that feeds no rollup: those first look up stored keys (tests/integration covers them)
    asyncio.run(sink.write("device_io", [runq(1), runq(2)]))
    assert client.inserted == 2 and not client.failures

    refusing = ClickHouseSink(FlakyClient(ValueError("Cannot parse input")), retry_delay_s=0.01)
    with pytest.raises(ValueError):
        asyncio.run(refusing.write("device_io", [runq(1)]))
    assert refusing.client.inserted == 0
    sink.close()
    refusing.close()


def test_host_state_waits_once_for_a_new_hosts_topology():
    state = HostState()

    async def scenario():
        asyncio.get_running_loop().call_later(
            0.1, state.learn, events.Topology(host="h1", boot_id="b", seq=1, ts_ns=1, cpus=[0, 1], numa_nodes=[]))
        arrived = await state.cpus("h1", wait_s=5)
        never = await state.cpus("h2", wait_s=0.2)
        started = asyncio.get_running_loop().time()
        again = await state.cpus("h2", wait_s=5)  # waited once already: no second wait
        return arrived, never, again, asyncio.get_running_loop().time() - started

    arrived, never, again, second_wait = asyncio.run(scenario())
    assert arrived == [0, 1] and never is None and again is None and second_wait < 1
