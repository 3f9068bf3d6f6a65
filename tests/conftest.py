"""Shared fixtures: a real Kafka-protocol broker (embedded Tansu), real
ClickHouse (chDB in a temp dir), and the product's own processes started the
way `jitterscope up` starts them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jitterscope.broker import EmbeddedBroker, free_port
from jitterscope.query import query_worker, run_query, running_worker
from jitterscope.common.settings import load


@pytest.fixture(scope="session", autouse=True)
def keep_last_cpu_for_workloads():
    """Tests (and the collector/worker they start) stay off the last CPU, where
    the starvation workloads run, so the unloaded control run is really unloaded."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        os.sched_setaffinity(0, set(cpus[:-1]))
    yield
    os.sched_setaffinity(0, set(cpus))


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker() as b:
        yield b


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode


@dataclass
class Stack:
    """Environment for product processes under test, and helpers to start them."""

    broker: EmbeddedBroker
    data_dir: Path
    web_port: int
    env: dict = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)

    def spawn(self, name: str, *args: str, **env: str) -> Proc:
        log = self.data_dir / f"{name}.log"
        popen = subprocess.Popen(
            [sys.executable, "-m", "jitterscope.cli", *args], env={**self.env, **env},
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def start_worker(self) -> Proc:
        return self.start_worker_with()

    def start_worker_with(self, **env: str) -> Proc:
        worker = self.spawn("streams", "streams", **env)
        wait_until(lambda: self.query_ok(), 90, f"streams worker answering on {self.web_port}", worker)
        return worker

    def start_collector(self, *args: str, **env: str) -> Proc:
        collector = self.spawn("collector", "collector", *args, **env)
        wait_until(lambda: "collector started" in collector.text(), 90, "collector start", collector)
        return collector

    def query(self, sql: str, **parameters) -> list[list]:
        settings = load(data_dir=self.data_dir)
        return run_query(settings, sql, {k: str(v) for k, v in parameters.items()})[1]

    def query_ok(self) -> bool:
        """The worker itself answers (never open the store from the test
        process: chDB admits one process per data directory)."""
        try:
            worker = running_worker(load(data_dir=self.data_dir))
            return bool(worker) and query_worker(worker, "SELECT 1", {})[1] == [[1]]
        except Exception:
            return False

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def wait_until(predicate, timeout: float, what: str, proc: Proc | None = None, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise AssertionError(f"{proc.name} exited ({proc.popen.returncode}) waiting for {what}:\n{proc.text()[-3000:]}")
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                         + (f"\n{proc.name} log:\n{proc.text()[-3000:]}" if proc else ""))


@pytest.fixture(scope="module")
def stack(broker, tmp_path_factory):
    s = make_stack(broker, tmp_path_factory.mktemp("jitterscope"))
    yield s
    s.stop_all()


def make_stack(broker, data_dir: Path) -> Stack:
    """A Stack with its own store and web port: several can share one broker."""
    web_port = free_port()
    env = dict(os.environ)
    env.pop("JITTERSCOPE_CONFIG", None)
    env.update({
        "JITTERSCOPE_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "JITTERSCOPE_DATA_DIR": str(data_dir),
        "JITTERSCOPE_STREAMS_WEB_PORT": str(web_port),
        "JITTERSCOPE_KAFKA_SESSION_TIMEOUT_S": "6",
        "JITTERSCOPE_SINK_FLUSH_S": "0.3",
        "JITTERSCOPE_COLLECTOR_METRICS_PORT": "0",
        "JITTERSCOPE_OTLP_PORT": "0",
        "JITTERSCOPE_HOST": f"test-{os.getpid()}",
    })
    return Stack(broker, data_dir, web_port, env)


def json_lines(payload: bytes) -> list[dict]:
    return [json.loads(line) for line in payload.splitlines() if line.strip()]


def records_on_topic(bootstrap_servers: str, topic: str, record_type: type) -> list:
    """Every record on a topic, read from the beginning until nothing new
    comes for 5 s (the worker's sends may still be in flight)."""
    import uuid

    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from jitterscope.schemas import events

    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"t-{uuid.uuid4()}",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        decoder, out, idle_until = events.BatchDecoder(record_type), [], time.monotonic() + 5
        while time.monotonic() < idle_until:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            good, bad = decoder.decode(message.value())
            assert not bad, bad
            out += good
            idle_until = time.monotonic() + 5
        return out
    finally:
        consumer.close()
