# SPDX-License-Identifier: Apache-2.0
"""The streams worker's Faust topics assume the partitions the broker has
(kafka_partitions, which `jitterscope topics` creates and the front door
checks), never a constant of their own."""

from __future__ import annotations

from jitterscope.common.settings import load
from jitterscope.schemas import topics
from jitterscope.streams.app import StreamsWorker
from jitterscope.streams.handlers import Handlers
from jitterscope.streams.host_state import HostState


def test_every_faust_topic_uses_the_configured_partitions_and_replication(tmp_path):
    s = load(kafka_partitions=12, kafka_replication_factor=3, streams_web_port=0, data_dir=tmp_path)
    worker = StreamsWorker.__new__(StreamsWorker)  # the app alone: no ClickHouse needed for its topics
    worker.settings, worker.stage, worker.handlers = s, "all", Handlers(HostState())
    app = worker._build_app("kafka-1:9092")
    assert (app.conf.topic_partitions, app.conf.topic_replication_factor) == (12, 3)
    channels = {agent.channel.get_topic_name(): agent.channel.partitions for agent in app.agents.values()}
    assert channels == {name: 12 for name in topics.INPUT_TOPICS}
    assert {t.partitions for t in (worker.alerts_topic, worker.deadletter_topic, worker.attribution_topic)} == {12}
    assert app.conf.broker_credentials is None  # PLAINTEXT by default


def test_each_stage_is_its_own_consumer_group_reading_its_own_topics(tmp_path):
    """streams/stages.py: the judge reads what its rules judge and its host
    state learns, never opens the store (it builds with no ClickHouse at all);
    so does the attribution stage, which reads the spans, the kernel
    evidence and the host records; the store reads every input topic, the
    alert rows and the attributions the other stages publish."""
    s = load(streams_web_port=0, judge_web_port=0, data_dir=tmp_path)
    judge = StreamsWorker(s, "kafka-1:9092", stage="judge")
    assert judge.app.conf.id == "jitterscope-judge" and judge.attributor is None and not hasattr(judge, "client")
    read = {agent.channel.get_topic_name() for agent in judge.app.agents.values()}
    assert {topics.RUNQ, topics.PROCESSES, topics.TOPOLOGY, topics.CGROUP_THROTTLE} <= read
    assert not read & {topics.REQUESTS, topics.STACKS, topics.BLOCKED, topics.ALERT_ROWS}
    assert not (tmp_path / "clickhouse").exists()

    store = StreamsWorker.__new__(StreamsWorker)
    store.settings, store.stage, store.handlers = s, "store", Handlers(HostState())
    app = store._build_app("kafka-1:9092")
    assert app.conf.id == "jitterscope-store"
    assert {a.channel.get_topic_name() for a in app.agents.values()} == {
        *topics.INPUT_TOPICS, topics.ALERT_ROWS, topics.ATTRIBUTION}

    attribute = StreamsWorker(s, "kafka-1:9092", stage="attribute")
    assert attribute.app.conf.id == "jitterscope-attribute" and attribute.attributor is not None
    assert not hasattr(attribute, "client") and not (tmp_path / "clickhouse").exists()
    read = {agent.channel.get_topic_name() for agent in attribute.app.agents.values()}
    assert {topics.REQUESTS, topics.RUNQ, topics.BLOCKED, topics.CGROUP_THROTTLE, topics.PROCESSES,
            topics.STACKS} <= read  # the stacks: the frames its OTLP spans name
    assert not read & {topics.ALERT_ROWS, topics.ATTRIBUTION, topics.HISTOGRAMS}

    both = StreamsWorker.__new__(StreamsWorker)  # up's second process: attribution and the store
    both.settings, both.stage, both.handlers = s, "attribute-store", Handlers(HostState())
    app = both._build_app("kafka-1:9092")
    assert app.conf.id == "jitterscope-store"
    assert {a.channel.get_topic_name() for a in app.agents.values()} == {*topics.INPUT_TOPICS, topics.ALERT_ROWS}
