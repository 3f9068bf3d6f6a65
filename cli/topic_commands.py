# SPDX-License-Identifier: Apache-2.0
"""`jitterscope topics create|check`: the commands over topic_admin.py, which
knows the topics and what they should look like.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from jitterscope.common import errors
from jitterscope.options import BootstrapOpt, ConfigOpt, SetOpt, console, load_settings, require_broker

topics_app = typer.Typer(
    help="Create or check jitterscope's Kafka topics (kafka_partitions, kafka_replication_factor).",
    no_args_is_help=True)


PartitionsOpt = Annotated[Optional[int], typer.Option(help="partitions per topic (kafka_partitions, default 4)")]
ReplicationOpt = Annotated[Optional[int], typer.Option(help="replicas per topic (kafka_replication_factor, default 1)")]


def _broker_settings(config, sets, bootstrap_servers, partitions, replication_factor):
    """Both commands' settings, with a broker to talk to."""
    s = load_settings(config, sets, bootstrap_servers=bootstrap_servers, kafka_partitions=partitions,
                      kafka_replication_factor=replication_factor)
    require_broker(s)
    return s


@topics_app.command("create")
def topics_create(
    sets: SetOpt = None,
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    partitions: PartitionsOpt = None,
    replication_factor: ReplicationOpt = None,
) -> None:
    """Create every missing jitterscope topic, then check them all."""
    from jitterscope import topic_admin as topics

    s = _broker_settings(config, sets, bootstrap_servers, partitions, replication_factor)
    created = topics.create(s)
    console.print(f"created {len(created)} topic(s) on {s.bootstrap_servers}"
                  + (f": {', '.join(created)}" if created else ""), soft_wrap=True)
    _topics_report(s)


@topics_app.command("check")
def topics_check(
    sets: SetOpt = None,
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    partitions: PartitionsOpt = None,
    replication_factor: ReplicationOpt = None,
) -> None:
    """Check every jitterscope topic exists with the configured partitions and replication factor (exit 1 if not)."""
    _topics_report(_broker_settings(config, sets, bootstrap_servers, partitions, replication_factor))


def _topics_report(s) -> None:
    from jitterscope import topic_admin as topics

    states = topics.describe(s)
    bad = topics.problems(s, states)
    for t in states:
        mark = "[red]FAIL[/]" if t.name in bad else "[green]ok[/]  "
        detail = bad.get(t.name) or f"{t.partitions} partitions, replication factor {t.replication_factor}"
        console.print(f"{mark} {t.name:32} {detail}")
    if bad:
        raise errors.BadConfig(f"{len(bad)} of {len(states)} topics are not as configured; jitterscope topics create "
                               f"--bootstrap-servers {s.bootstrap_servers} makes missing ones")
