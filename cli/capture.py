# SPDX-License-Identifier: Apache-2.0
"""`jitterscope record` and `replay`: capture an incident on a host without a
pipeline into a file (collector/recording.py), and publish it into one later.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from jitterscope.common import errors
from jitterscope.options import (BootstrapOpt, CommOpt, ConfigOpt, HostOpt, PidOpt, SetOpt, ThresholdOpt, console,
                                 err_console, load_settings)


def record(
    out: Annotated[Path, typer.Option(
        "--out", help="recording file to write (gzip, mode 0600; replaced if it exists; never a symlink)")],
    duration: Annotated[float, typer.Option(help="record for this many seconds (Ctrl-C stops earlier)")],
    sets: SetOpt = None,
    config: ConfigOpt = None,
    host: HostOpt = None,
    pid: PidOpt = None,
    comm: CommOpt = None,
    threshold_ms: ThresholdOpt = None,
) -> None:
    """Run this host's collector into a file instead of Kafka, to capture an incident on a host without a
    pipeline (needs root). The file holds the collector's Kafka messages with their keys; 'jitterscope replay'
    publishes them later."""
    from jitterscope.collector.agent import Collector, install_signal_handlers
    from jitterscope.collector.recording import RecordingPublisher
    from jitterscope.common import logs

    s = load_settings(config, sets, host=host, target_pids=pid, target_comms=comm, runq_threshold_ms=threshold_ms,
                      collector_metrics_port=0)
    logs.setup()

    def progress(p) -> None:
        err_console.print(f"recording: {p.records_sent:,} records, {_size(p.bytes_written)}", highlight=False)

    publisher = RecordingPublisher(out, s.host, max_message_bytes=s.kafka_max_message_bytes,
                                   max_records=s.batch_max_records, progress=progress, progress_every_s=5.0)
    agent = Collector(s, publisher=publisher)
    install_signal_handlers(agent)
    agent.run(duration)
    per_topic = ", ".join(f"{t.removeprefix('jitterscope.')} {n:,}" for t, n in sorted(publisher.sent_by_topic.items()))
    console.print(f"recorded {publisher.records_sent:,} records ({per_topic or 'none'}) in {out}, "
                  f"{_size(out.stat().st_size)}", soft_wrap=True)
    if publisher.undelivered:
        raise errors.JitterscopeError(f"{publisher.undelivered} records could not be written: {publisher.last_error}")


def _size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def replay(
    file: Annotated[Path, typer.Argument(help="a recording made by 'jitterscope record'", exists=True, dir_okay=False)],
    bootstrap_servers: BootstrapOpt = None,
    create_topics: Annotated[bool, typer.Option(
        "--create-topics", help="create missing jitterscope topics first")] = False,
    host: Annotated[Optional[str], typer.Option(
        "--host", help="the host whose records to replay (required; the error names the hosts the file holds)")] = None,
    sets: SetOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Publish one host's records from a recording into a pipeline (real Kafka, or the broker of a running
    'jitterscope up'), keys kept: records keep their host, boot id and sequence, so replaying twice stores them
    once. Only jitterscope's input topics, and only records that carry --host, are published; other frames are
    refused and counted."""
    from jitterscope.collector.recording import summarize
    from jitterscope.collector.replay import check_host, replay as replay_file
    from jitterscope.common import kafka_auth

    summary = summarize(file)  # a damaged or hostile file is refused here, before anything else
    check_host(summary, host, file)
    s = load_settings(config, sets, bootstrap_servers=bootstrap_servers)
    if not s.bootstrap_servers:
        raise errors.BadConfig(
            "replay needs a broker: pass --bootstrap-servers HOST:PORT (or set JITTERSCOPE_BOOTSTRAP_SERVERS); "
            "for a local pipeline, start 'jitterscope up' and use the broker address it prints")
    if summary.truncated:
        from rich.markup import escape

        err_console.print(f"[yellow]note:[/] {escape(str(file))} is truncated ({escape(summary.error)}); replaying "
                          f"its {summary.records:,} complete records", soft_wrap=True)
    if create_topics:
        from jitterscope.topic_admin import create

        create(s)
    result = replay_file(
        file, s.bootstrap_servers, host=host, extra_config=kafka_auth.librdkafka_config(s),
        progress=lambda r: err_console.print(f"replaying: {r.records:,} of {summary.records:,} records"))
    per_topic = ", ".join(f"{t.removeprefix('jitterscope.')} {n:,}" for t, n in sorted(result.by_topic.items()))
    console.print(f"replayed {result.records:,} records of host {host} ({per_topic or 'none'}) in "
                  f"{result.messages:,} messages from {file} to {s.bootstrap_servers}", soft_wrap=True, markup=False)
    if result.refused:
        for why, frames in sorted(result.refused.items()):
            err_console.print(f"refused {frames:,} frame(s): {why}", soft_wrap=True, markup=False)
        raise errors.JitterscopeError(
            f"{sum(result.refused.values()):,} frame(s) ({result.refused_records:,} records) of {file} were refused "
            "and not published (see above)")
