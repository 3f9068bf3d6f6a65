# SPDX-License-Identifier: Apache-2.0
"""The streams worker's Faust topics assume the partitions the broker has
(kafka_partitions, which `jitterscope topics` creates and the front door
checks), never a constant of their own."""

from __future__ import annotations

from jitterscope.common.settings import load
from jitterscope.schemas import topics
from jitterscope.streams.app import StreamsWorker


def test_every_faust_topic_uses_the_configured_partitions_and_replication(tmp_path):
    s = load(kafka_partitions=12, kafka_replication_factor=3, streams_web_port=0, data_dir=tmp_path)
    worker = StreamsWorker.__new__(StreamsWorker)  # the app alone: no ClickHouse needed for its topics
    worker.settings = s
    app = worker._build_app("kafka-1:9092")
    assert (app.conf.topic_partitions, app.conf.topic_replication_factor) == (12, 3)
    channels = {agent.channel.get_topic_name(): agent.channel.partitions for agent in app.agents.values()}
    assert channels == {name: 12 for name in topics.INPUT_TOPICS}
    assert {t.partitions for t in (worker.alerts_topic, worker.deadletter_topic, worker.attribution_topic)} == {12}
    assert app.conf.broker_credentials is None  # PLAINTEXT by default
