"""`jitterscope up`: the whole single-host stack, supervised.

Starts the embedded broker (unless a Kafka is given), a streams worker and the
collector as child processes, prints each alert as it arrives, and on Ctrl-C
(or --duration) stops them in the order that loses nothing: the collector
first (it flushes), then the worker once it has drained, then the broker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime

from rich.console import Console

from jitterscope import errors
from jitterscope.broker import EmbeddedBroker, create_topics, wait_for_port
from jitterscope.schemas import events, topics
from jitterscope.settings import Settings, default_data_dir, to_env

DRAIN_S = 3.0  # time the worker gets after the collector stops, to store the last batches


def format_alert(alert: events.Alert) -> str:
    when = datetime.fromtimestamp(alert.ts_ns / 1e9).strftime("%H:%M:%S.%f")[:-3]
    if alert.kind != "runq_starvation":
        return f"{when} {alert.host} [{alert.severity}] {alert.summary}"
    held = f"{alert.suspect_comm} (pid {alert.suspect_pid})" if alert.suspect_pid else "idle/kernel"
    return (f"{when} {alert.host} [{alert.severity}] {alert.comm} (pid {alert.pid}, tid {alert.tid}) "
            f"waited {alert.wait_ns / 1e6:.1f} ms for CPU {alert.cpu}, held by {held}")


class Stack:
    def __init__(self, settings: Settings, console: Console):
        self.settings = settings
        self.console = console
        self.children: dict[str, subprocess.Popen] = {}
        self.broker: EmbeddedBroker | None = None

    def _spawn(self, name: str, args: list[str], bootstrap: str) -> None:
        env = dict(os.environ, **to_env(self.settings), JITTERSCOPE_BOOTSTRAP_SERVERS=bootstrap)
        env.pop("JITTERSCOPE_CONFIG", None)  # everything is resolved into the env already
        log = open(self.settings.data_dir / f"{name}.log", "ab")
        self.children[name] = subprocess.Popen(
            [sys.executable, "-m", "jitterscope.cli", *args], env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)

    def _check_children(self) -> None:
        for name, proc in self.children.items():
            if proc.poll() is not None:
                tail = (self.settings.data_dir / f"{name}.log").read_text(errors="replace").strip().splitlines()[-5:]
                raise errors.JitterscopeError(
                    f"{name} exited with status {proc.returncode}; last lines of "
                    f"{self.settings.data_dir / (name + '.log')}:\n  " + "\n  ".join(tail))

    def start(self) -> str:
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        with self.console.status("starting jitterscope") as status:
            if s.bootstrap_servers:
                bootstrap = s.bootstrap_servers
                status.update(f"checking Kafka at {bootstrap}")
                create_topics(bootstrap)
            else:
                status.update("starting the embedded broker")
                self.broker = EmbeddedBroker(s.broker_port, s.data_dir / "broker.log").start()
                bootstrap = self.broker.bootstrap_servers
            status.update("starting the streams worker and ClickHouse")
            self._spawn("streams", ["streams"], bootstrap)
            if s.streams_web_port:
                wait_for_port(s.streams_web_port, 60, self.children["streams"])
            status.update("starting the collector (compiling BPF)")
            self._spawn("collector", ["collector"], bootstrap)
        target = "all processes" if not s.filters_targets else f"pids {s.target_pids} comms {s.target_comms}"
        spans = f"request spans to http://{s.otlp_bind}:{s.otlp_port}/v1/traces; " if s.otlp_port else ""
        self.console.print(
            f"jitterscope up: watching {target} on {s.host} for run-queue waits >= {s.runq_alert_ms:g} ms "
            f"and {', '.join(s.hardware_probes) or 'no hardware sources'}; {spans}"
            f"Kafka {bootstrap}; logs in {s.data_dir}. Ctrl-C stops.", soft_wrap=True)
        return bootstrap

    def _alert_consumer(self, bootstrap: str):
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"jitterscope-up-{os.getpid()}",
                             "enable.auto.commit": False,
                             # Tansu holds a fetch for the whole wait: keep alerts prompt
                             "fetch.wait.max.ms": self.settings.kafka_fetch_max_wait_ms})
        # assign() instead of subscribe(): no group join to wait for. The embedded
        # broker is new, so all its alerts are ours; on a shared Kafka, only new ones.
        start = OFFSET_END if self.settings.bootstrap_servers else OFFSET_BEGINNING
        consumer.assign([TopicPartition(topics.ALERTS, p, start) for p in range(topics.PARTITIONS)])
        return consumer

    def run(self, duration: float | None) -> None:
        stop = {"now": False}
        signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
        decoder = events.BatchDecoder(events.Alert)
        alerts = 0
        try:
            bootstrap = self.start()
            consumer = self._alert_consumer(bootstrap)
            deadline = time.monotonic() + duration if duration else None
            try:
                while not stop["now"] and (deadline is None or time.monotonic() < deadline):
                    message = consumer.poll(0.5)
                    self._check_children()
                    if message is None or message.error():
                        continue
                    good, _bad = decoder.decode(message.value())
                    for alert in good:
                        alerts += 1
                        style = "bold red" if alert.severity == "critical" else "yellow"
                        # markup off: process names are untrusted and may contain [tags]
                        self.console.print(format_alert(alert), style=style, markup=False, soft_wrap=True)
            finally:
                consumer.close()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()
        where = "" if self.settings.data_dir == default_data_dir() else f" --data-dir {self.settings.data_dir}"
        self.console.print(f"jitterscope stopped: {alerts} alert(s). Query the store with: jitterscope query{where} "
                           "\"SELECT count() FROM jitterscope.runq_events\"", soft_wrap=True)

    def stop(self) -> None:
        with self.console.status("stopping"):
            for name in ("collector", "streams"):
                proc = self.children.get(name)
                if proc is None:
                    continue
                if name == "streams" and "collector" in self.children:
                    time.sleep(DRAIN_S)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
            if self.broker:
                self.broker.stop()
