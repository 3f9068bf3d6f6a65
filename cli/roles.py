# SPDX-License-Identifier: Apache-2.0
"""The long-running commands: `up` (the whole stack on one host), and the
roles a fleet runs apart: `collector`, `streams`, `broker`.

Each imports its role inside the command, so `jitterscope --help` stays fast
and a collector-only install never needs the streams dependencies.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from jitterscope.common import errors
from jitterscope.options import (AlertOpt, BootstrapOpt, ClickHouseOpt, CommOpt, ConfigOpt, DataDirOpt, HostOpt,
                                 PidOpt, SetOpt, ThresholdOpt, console, load_settings, require_broker, require_topics)


def up(
    sets: SetOpt = None,
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    clickhouse_url: ClickHouseOpt = None,
    data_dir: DataDirOpt = None,
    host: HostOpt = None,
    pid: PidOpt = None,
    comm: CommOpt = None,
    threshold_ms: ThresholdOpt = None,
    alert_ms: AlertOpt = None,
    broker_port: Annotated[Optional[int], typer.Option(help="embedded broker port (0 = any free port)")] = None,
    duration: Annotated[Optional[float], typer.Option(help="stop by itself after this many seconds")] = None,
) -> None:
    """Watch this host: embedded broker, collector, streams worker and ClickHouse; print alerts as they happen."""
    from jitterscope.up import Stack

    s = load_settings(config, sets, bootstrap_servers=bootstrap_servers, clickhouse_url=clickhouse_url,
                      data_dir=data_dir, host=host, target_pids=pid, target_comms=comm,
                      runq_threshold_ms=threshold_ms, runq_alert_ms=alert_ms, broker_port=broker_port)
    Stack(s, console).run(duration)


def collector(
    sets: SetOpt = None,
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    host: HostOpt = None,
    pid: PidOpt = None,
    comm: CommOpt = None,
    threshold_ms: ThresholdOpt = None,
    metrics_port: Annotated[Optional[int], typer.Option(help="Prometheus /metrics port (0 = off)")] = None,
    duration: Annotated[Optional[float], typer.Option(help="stop by itself after this many seconds")] = None,
) -> None:
    """Run this host's collector: load the probes and publish their records to Kafka (needs root)."""
    from jitterscope.common import logs
    from jitterscope.collector.agent import Collector, install_signal_handlers
    from jitterscope.collector.probes.base import require_loadable

    s = load_settings(config, sets, bootstrap_servers=bootstrap_servers, host=host, target_pids=pid,
                      target_comms=comm, runq_threshold_ms=threshold_ms, collector_metrics_port=metrics_port)
    require_broker(s)
    require_loadable()  # not root, no tracefs, ...: say so first, not after a wait for Kafka
    require_topics(s, duration)
    logs.setup()
    agent = Collector(s)
    install_signal_handlers(agent)
    agent.run(duration)


def streams(
    sets: SetOpt = None,
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    clickhouse_url: ClickHouseOpt = None,
    data_dir: DataDirOpt = None,
    alert_ms: AlertOpt = None,
    web_port: Annotated[Optional[int], typer.Option(help="port for /metrics and /query (0 = off)")] = None,
    stage: Annotated[Optional[str], typer.Option(
        help="all (one process), judge (alert rules only), attribute (requests joined with evidence) or "
             "store (into ClickHouse); each stage is its own consumer group, and scales by adding processes")] = None,
) -> None:
    """Run a streams worker: decode, alert, and write everything to ClickHouse (or one stage of that)."""
    from jitterscope.common import logs
    from jitterscope.streams.app import StreamsWorker

    s = load_settings(config, sets, bootstrap_servers=bootstrap_servers, clickhouse_url=clickhouse_url,
                      data_dir=data_dir, runq_alert_ms=alert_ms, streams_web_port=web_port, streams_stage=stage)
    require_broker(s)
    require_topics(s)
    logs.setup()
    StreamsWorker(s, s.bootstrap_servers).run()


def broker(
    port: Annotated[int, typer.Option(help="port to listen on, 127.0.0.1 only")] = 29092,
) -> None:
    """Run the embedded Kafka-compatible broker (Tansu) with jitterscope's topics, until Ctrl-C."""
    import signal
    import threading

    from jitterscope.broker import EmbeddedBroker

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with EmbeddedBroker(port) as b:
        console.print(f"broker on {b.bootstrap_servers} (memory only); Ctrl-C stops it")
        try:
            while not stop.wait(0.5):
                if b.proc.poll() is not None:
                    raise errors.BrokerUnavailable(f"broker exited with status {b.proc.returncode}")
        except KeyboardInterrupt:
            pass
