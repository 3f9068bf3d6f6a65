# SPDX-License-Identifier: Apache-2.0
"""The streams worker: a Faust app (aiokafka driver) over the raw topics.

Each input topic has one agent that decodes each message with the shared
record types and judges it as it arrives, then queues it for the store,
which writes batches to ClickHouse and only then lets Faust commit their
offsets (at-least-once; the sink's keys make it exact).
Undecodable input goes to the dead-letter topic with its reason and the agent
carries on. The store path (batches written, refused records isolated and
dead-lettered) is streams/store_path.py; the attribution tick, which
attributes the requests whose grace period is over and publishes them, is
streams/attribution_tick.py.

Records go to their signal's rules through the topic -> handler table
(streams/handlers.py); what the rules know about each host is in
streams/host_state.py; the Kafka client patches are in
streams/kafka_patches.py; the web pages are in streams/web.py. Alerts are
grouped (streams/alert_groups.py) before they reach the alerts topic and the
notification targets (streams/notify.py); every alert is stored. What the
broker refuses to take is sent again (streams/outbox.py).

A process runs one stage of the pipeline (streams/stages.py): ``judge`` (the
rules alone, no ClickHouse), ``store`` (attribution and the store) or
``all`` (everything on one loop, as before the split).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Sequence

import faust
from prometheus_client import Counter

from jitterscope.common import kafka_auth, logs, ports
from jitterscope.schemas import batches, events, topics
from jitterscope.common.settings import Settings
from jitterscope.common import buildinfo  # noqa: F401  (registers jitterscope_build_info)
from jitterscope.streams import clickhouse, kafka_patches, notify, signal_metrics, stages, web
from jitterscope.streams.alert_groups import AlertGroups, Audience, announced
from jitterscope.streams.alert_metrics import count_raised
from jitterscope.streams.attribution import Attributor
from jitterscope.streams.attribution_stage import AttributionStage, HeldRequests
from jitterscope.streams.attribution_tick import AttributionTick
from jitterscope.streams.handlers import Handlers
from jitterscope.streams.otlp_export import AttributionExport
from jitterscope.streams.outbox import Outbox
from jitterscope.streams.host_state import HostState
from jitterscope.streams.rules.base import Thresholds
from jitterscope.streams.sink import ClickHouseSink
from jitterscope.streams.store_path import Decoded, StorePath
from jitterscope.streams.store_queue import StoreQueue
from jitterscope.streams.token_slo import TokenObjectives
from jitterscope.streams.worker_state import state_file

log = logging.getLogger("jitterscope.streams")

RECORDS_IN = Counter("jitterscope_streams_records_total", "records decoded", ["topic"])

ATTRIBUTION_TICK_S = 0.25
#: the attribution stage's: nothing else shares its loop, and a request is due as soon as its evidence came
ATTRIBUTE_STAGE_TICK_S = 0.1
#: how often run-queue waits parked for a record are checked for a deadline passed (streams/handlers.py)
PARKED_TICK_S = 0.05
ALERT_GROUP_TICK_S = 0.5
LEARNED = stages.LEARNED
#: what the judge and attribution stages published (alert rows, attributions), written as each exits, read by
#: `up` (its drain)
STAGE_FINAL_FILES = {"judge": "judge-final.json", "attribute": "attribute-final.json"}
JUDGE_FINAL_FILE = STAGE_FINAL_FILES["judge"]
#: records that may wait for the store per topic, in batches of sink_batch_rows (streams/store_queue.py)
STORE_AHEAD_BATCHES = 2


def faust_credentials(s: Settings) -> "faust.types.auth.CredentialsT | None":
    """The Kafka security settings as Faust credentials for its aiokafka
    driver (consumer, producer and admin alike); None = PLAINTEXT. The
    collector's librdkafka gets the same settings through kafka_auth."""
    context = kafka_auth.ssl_context(s)
    if s.kafka_security_protocol.startswith("SASL_"):
        return faust.SASLCredentials(username=s.kafka_sasl_username, password=kafka_auth.sasl_password(s),
                                     mechanism=s.kafka_sasl_mechanism, ssl_context=context)
    return faust.SSLCredentials(context) if context is not None else None


def faust_app(s: Settings, bootstrap_servers: str, stage: str = "all") -> faust.App:
    """The Faust app of a stage (its own consumer group), configured from
    the settings: its topics, consumer, producer and web server."""
    web_port = {"judge": s.judge_web_port, "attribute": s.attribute_web_port}.get(stage, s.streams_web_port)
    return faust.App(
        stages.APP_IDS[stage],
        broker=f"kafka://{bootstrap_servers}",
        broker_credentials=faust_credentials(s),
        store="memory://",
        # what `jitterscope topics` made, and the front door checked before start
        topic_partitions=s.kafka_partitions,
        topic_replication_factor=s.kafka_replication_factor,
        topic_disable_leader=True,
        topic_allow_declare=False,  # topics are created up front with the shared partition count
        broker_session_timeout=s.kafka_session_timeout_s,
        broker_rebalance_timeout=s.kafka_session_timeout_s,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=1.0,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        stream_wait_empty=False,
        web_enabled=bool(web_port),
        web_host=s.streams_web_bind,
        web_bind=s.streams_web_bind,
        web_port=web_port or 6066,
        datadir=str(s.data_dir / ("faust" if stage == "all" else f"faust-{stage}")),
    )


class StreamsWorker(StorePath, AttributionTick, AttributionStage):
    """The worker: its Faust app, agents and timers, and the judging they
    call. The store path (StorePath, streams/store_path.py) and the
    attribution tick (AttributionTick, streams/attribution_tick.py) are mixed in."""

    def __init__(self, settings: Settings, bootstrap_servers: str, stage: str | None = None):
        self.stage = stage or settings.streams_stage
        # Faust binds the web port only once it runs, and a port taken ends it
        # with a traceback: say it in one line, before the store is opened
        ports.require_free(*ports.stage_listeners(self.stage, settings))
        self.settings = settings
        self.bootstrap_servers = bootstrap_servers
        self.state = HostState()
        self.attributor = None  # type: ignore[assignment]  # until a stage that attributes sets it (the judge never)
        self.alert_rows_sent = self.attributions_sent = 0  # what the judge or attribution stage published
        # set once the judge has re-learned the partitions it took: Faust resumes the streams before the
        # assignment hook ends, and a wait judged before then would be parked for a record already sent
        self.relearned = asyncio.Event()
        # the attribution stage's: request messages held until attributed, how far it read each partition
        # of the other topics ((topic, partition) -> offset: read again, below it is skipped), and the hosts of each
        self.held_requests = HeldRequests()
        self.read_until: dict[tuple[str, int], int] = {}
        self.partition_hosts: dict[int, set[str]] = {}
        if self.stage in stages.STORING:  # the others never open the store: chDB admits one process per data directory
            self._open_store()
        if self.stage == "attribute":  # its state comes from the topics, on taking partitions (regain)
            self.attributor = self._new_attributor()
        self.handlers = Handlers(self.state, Thresholds.from_settings(settings), self.attributor,
                                 audience=Audience.from_settings(settings))
        self._late_counted = self._columnar_counted = 0
        signal_metrics.limit_comms(settings.metrics_comms_max)
        self.alert_groups = AlertGroups.from_settings(settings)
        self.notifier = notify.Notifier.from_settings(settings)
        self.exporter = AttributionExport.from_settings(settings)  # answers into the user's traces (OTLP)
        self.outbox = Outbox()
        self.app = self._build_app(bootstrap_servers)

    def _open_store(self) -> None:
        """ClickHouse (migrated), the sink, the host state and the attributor
        primed from what is stored."""
        settings = self.settings
        self.client = clickhouse.connect_with_retry(settings.clickhouse_url, settings.data_dir)
        if not settings.clickhouse_cluster:  # a cluster's schema is the operator's: `jitterscope schema --cluster`
            clickhouse.migrate(self.client)
        clickhouse.apply_retention(self.client, settings.retention_days, settings.clickhouse_cluster)
        self.reader = clickhouse.connect(settings.clickhouse_url, settings.data_dir, readonly=True)
        self.sink = ClickHouseSink(self.client)
        self.state.prime(self.client)
        if self.stage in stages.ATTRIBUTING_IN_PROCESS:
            self.attributor = self._new_attributor()
            self.prime_attribution()

    def _new_attributor(self) -> Attributor:
        settings = self.settings
        return Attributor(
            grace_ns=int(settings.attribution_grace_s * 1e9), horizon_ns=int(settings.evidence_horizon_s * 1e9),
            slo_ns=int(settings.request_slo_ms * 1e6) if settings.request_slo_ms else None,
            slo_factor=settings.request_slo_factor, min_samples=settings.baseline_min_samples,
            max_events_per_host=settings.evidence_max_events, max_pending=settings.pending_requests_max,
            processes=self.state,  # serving groups and cgroups, as the collectors describe them
            tokens=TokenObjectives.from_settings(settings))

    def prime_attribution(self) -> None:
        """After a restart, pick up where the last worker left off: recent
        evidence, recent durations (baselines), and requests stored but not
        yet attributed (their offsets were committed once stored)."""
        horizon = {"horizon": int(self.settings.evidence_horizon_s)}
        recent = "ts > now64(9) - toIntervalSecond({horizon:UInt32})"
        for kind in (events.RunqEvent, events.CgroupThrottle, events.IrqTime):
            for event in clickhouse.select_records(self.client, kind, recent, horizon):
                self.attributor.add_evidence(event)
        for done in clickhouse.select_records(self.client, events.RequestAttribution, recent, horizon):
            self.attributor.remember(done)
        pending = (recent + f" AND (host, boot_id, seq) NOT IN (SELECT host, boot_id, seq FROM "
                   f"{clickhouse.DATABASE}.request_attribution WHERE {recent})")
        for span in clickhouse.select_records(self.client, events.RequestSpan, pending, horizon):
            self.attributor.add_request(span)

    def _build_app(self, bootstrap_servers: str) -> faust.App:
        s = self.settings
        kafka_patches.apply(s.kafka_fetch_max_wait_ms, s.kafka_fetch_busy_wait_ms)
        app = faust_app(s, bootstrap_servers, self.stage)

        def raw_topic(name: str):
            return app.topic(name, key_type=bytes, key_serializer="raw", value_type=bytes,
                             value_serializer="raw", partitions=s.kafka_partitions)

        self.alerts_topic = raw_topic(topics.ALERTS)
        self.deadletter_topic = raw_topic(topics.DEADLETTER)
        self.alert_rows_topic = raw_topic(topics.ALERT_ROWS)
        for name, record_type in stages.stage_topics(self.stage, self.handlers.table).items():
            self._add_agent(app, raw_topic(name), name, record_type)
        web.add_routes(app, self, query=self.stage in stages.STORING)

        self.attribution_topic = raw_topic(topics.ATTRIBUTION)
        self._add_hand_over_hooks(app)
        self._add_timers(app)
        self._add_announce(app)
        return app

    def _add_hand_over_hooks(self, app: faust.App) -> None:
        """What the worker does when partitions come and go, and before it stops."""
        held: set = set()

        @app.on_partitions_assigned.connect  # type: ignore[arg-type]  # Faust awaits a coroutine receiver
        async def take_over(_app, assigned, **_kwargs) -> None:
            # partitions new to this worker bring hosts another worker stored last
            gained, lost = set(assigned) - held, held - set(assigned)
            held.clear()
            held.update(assigned)
            if lost and self.stage == "attribute":  # a partition revoked and given back is kept, not rebuilt
                self.let_go({tp.partition for tp in lost} - {tp.partition for tp in assigned})
            if self.stage in ("judge", "attribute"):
                try:
                    if gained:
                        await (self.relearn if self.stage == "judge" else self.regain)(gained)
                    if self.stage == "attribute":
                        await self.catch_up(assigned)
                finally:
                    self.relearned.set()
            elif gained:
                await self.sink.run(self.sink.forget_hosts)

        # a parked wait's message is stored and committed: judge it before another worker takes its host, or none will
        @app.on_partitions_revoked.connect  # type: ignore[arg-type]
        async def judge_parked_on_hand_over(_app, revoked, **_kwargs) -> None:
            self.relearned.clear()  # until the assignment that follows has been re-learned
            if revoked and self.stage != "attribute":  # its requests stay uncommitted until attributed
                await self.judge_all_parked()

        @app.on_before_shutdown.connect  # type: ignore[arg-type]
        async def judge_parked_on_stop(_app, **_kwargs) -> None:
            if self.stage == "attribute":
                await self.attribute_all()
            else:
                await self.judge_all_parked()

    async def relearn(self, gained) -> None:
        """The judge's host state for partitions it just took, from the
        topics (streams/stages.py: replay), within half a session."""
        s = self.settings
        started = time.monotonic()
        learned = 0

        def learn(_topic: str, records: list[events.Record]) -> None:
            nonlocal learned
            for record in records:
                self.state.learn(record)
            learned += len(records)

        try:
            await stages.replay(
                self._side_consumer, [(tp.topic, tp.partition) for tp in gained if tp.topic in stages.LEARNED_TOPICS],
                lambda _t: int((time.time() - s.judge_replay_s) * 1e3), learn, started + s.kafka_session_timeout_s / 2)
            log.info("judge: learned %d host records again in %.2f s", learned, time.monotonic() - started)
        except Exception:  # the collectors re-send them within a minute: judge on meanwhile
            log.exception("judge: could not re-read the host records; they come again with the collectors' next")

    async def _side_consumer(self):
        """A started aiokafka consumer in this stage's group that never joins
        it: to read committed offsets and re-read partitions."""
        from aiokafka import AIOKafkaConsumer
        from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers, group_id=self.app.conf.id, enable_auto_commit=False,
            **credentials_to_aiokafka_auth(faust_credentials(self.settings)))
        await consumer.start()
        return consumer

    def _add_timers(self, app: faust.App) -> None:
        """The stage's ticks: attribution (not the judge's), the parked
        run-queue waits (not the store's) and the alert groups; and its loop-lag probe."""
        ticks = [(ALERT_GROUP_TICK_S, lambda: self.alert_groups_due(time.time_ns()), "alert group")]
        if self.stage in stages.ATTRIBUTING_IN_PROCESS:
            ticks.append((ATTRIBUTION_TICK_S, lambda: self.attribute_due(time.time_ns()), "attribution"))
        if self.stage == "attribute":
            ticks.append((ATTRIBUTE_STAGE_TICK_S, self.attribute_when_caught_up, "attribution"))
        if self.stage in ("all", "judge"):
            ticks.append((PARKED_TICK_S, self.parked_due, "parked run-queue waits"))
        for interval, step, what in ticks:
            self._add_tick(app, interval, step, what)

        @app.task
        async def loop_lag() -> None:
            await stages.measure_loop_lag(self.stage)

    @staticmethod
    def _add_tick(app: faust.App, interval: float, step, what: str) -> None:
        async def tick() -> None:
            try:
                await step()
            except Exception:  # the timer must keep running: the next tick does what is due (pending, open groups)
                log.exception("%s tick failed", what)

        app.timer(interval=interval, name=f"{what} tick")(tick)

    def _add_announce(self, app: faust.App) -> None:
        s = self.settings

        @app.task
        async def announce() -> None:
            if s.streams_web_port and self.stage in stages.STORING:  # the other stages have no store to query
                # /query wants this token; the port is open to every local
                # user, the state file only to the store's owner. The file is
                # created 0600 before anything is written to it, then renamed
                # into place, so it is never readable by others or half-written.
                import secrets

                self.query_token = secrets.token_urlsafe(32)
                path = state_file(s.data_dir)
                tmp = path.with_name(f".{path.name}.{os.getpid()}")
                tmp.unlink(missing_ok=True)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as out:
                    json.dump({"pid": os.getpid(), "port": s.streams_web_port, "bind": s.streams_web_bind,
                               "token": self.query_token}, out)
                os.replace(tmp, path)
            log.info("streams worker ready (stage %s)", self.stage)

    def _add_agent(self, app: faust.App, topic, name: str, record_type: type[events.Record]) -> None:
        decoder = batches.BatchDecoder(record_type)
        table = clickhouse.TABLE_OF[record_type]
        RECORDS_IN.labels(name)  # at 0 from the start: its topics are the ones a stage reads (`up`'s drain)
        batch = self.settings.sink_batch_rows

        async def consume(stream):
            # Each message is decoded and judged as it arrives; the store
            # (streams/store_queue.py) takes what gathered meanwhile and acks
            # it once stored, so alerts never wait for inserts and Faust
            # commits only stored offsets.
            stream = stream.noack()
            queue: StoreQueue[tuple[Decoded, faust.types.EventT]] = StoreQueue(
                batch, STORE_AHEAD_BATCHES * batch, self.settings.sink_flush_s)
            storing = asyncio.ensure_future(self._store_from(queue, stream, name, table))
            try:
                async for event in stream.events():
                    if storing.done():
                        storing.result()  # the store loop never ends but by a bug: crash the agent with it
                    decoded = await self.receive(name, decoder, event.value, event.message)
                    await queue.put((decoded, event), len(decoded.records) + len(decoded.alerts))
            finally:
                storing.cancel()

        async def judge_only(stream):
            # The judge: alerts and their rows are out before the message is
            # acked (at-least-once); the store stage stores the records.
            stream = stream.noack()
            async for event in stream.events():
                if not self.relearned.is_set():
                    await self.relearned.wait()
                decoded = await self.receive(name, decoder, event.value, event.message)
                if decoded.alerts:
                    await self.keep_alerts(decoded.alerts)
                await stream.ack(event)

        async def attribute_only(stream):
            # evidence acked as read, requests once attributed (streams/attribution_stage.py)
            stream = stream.noack()
            async for event in stream.events():
                if not self.relearned.is_set():
                    await self.relearned.wait()
                await self.attribute_message(stream, event, name, decoder)

        consume = {"judge": judge_only, "attribute": attribute_only}.get(self.stage, consume)
        consume.__name__ = f"consume_{name.split('.')[-1]}"
        app.agent(topic, name=consume.__name__)(consume)

    async def _store_from(self, queue: "StoreQueue", stream, name: str, table: str) -> None:
        """Store what the judge queued, then ack its messages (in order).
        Messages read before a rebalance are not stored: they are unacked,
        so their partition's owner now reads them again, and a late insert
        here would race with its own (it may be the new owner of the host)."""
        while True:
            taken = await queue.take()
            generation = self.app.consumer_generation_id
            current = [(decoded, event) for decoded, event in taken if event.message.generation_id == generation]
            if len(current) < len(taken):
                log.info("%s: %d messages read before the rebalance left to their partition's owner",
                         name, len(taken) - len(current))
            await self.store(name, table, [decoded for decoded, _ in current])
            for _, event in current:
                await stream.ack(event)

    async def receive(self, topic: str, decoder: batches.BatchDecoder, value, message) -> "Decoded":
        host = message.key.decode(errors="replace") if isinstance(message.key, bytes) else ""
        stages.observe_age(self.stage, topic, message.timestamp)
        good, bad = decoder.decode(value if isinstance(value, bytes) else b"")
        dead = [events.DeadLetter(
            host=host, topic=topic, partition=message.partition, offset=message.offset, line=b.line,
            reason=b.reason, payload=b.payload.decode(errors="replace"), ts_ns=time.time_ns(),
        ) for b in bad]
        RECORDS_IN.labels(topic).inc(len(good))
        try:
            alerts = await self.judge(topic, good)
        except Exception:  # a rule's bug must not cost the records: they are still stored
            log.exception("rules failed on %s[%d]@%d; records are stored without alerts",
                          topic, message.partition, message.offset)
            alerts = []
        return Decoded(good, dead, alerts, message.partition, message.offset, host)

    async def judge(self, topic: str, good: list[events.Record]) -> list[events.Alert]:
        if good and isinstance(good[0], LEARNED):  # a message holds one record type: skip the bulk topics
            for record in good:
                self.state.learn(record)
        if self.stage == "store":  # the judges judge and the attribution stage attributes: here records are stored
            return []
        if self.stage in ("attribute", "attribute-store"):  # here records only feed the attributor
            self.handlers.feed(topic, good)
            return []
        alerts = await self.handlers.handle(topic, good, time.time_ns())
        count_raised(alerts)
        return await self.announce_alerts(alerts)

    async def parked_due(self, everything: bool = False) -> None:
        """Judge the run-queue waits parked for a record whose deadline
        passed (streams/handlers.py), or ``everything`` parked; their alerts
        go where a message's go."""
        alerts = self.handlers.flush() if everything else self.handlers.due()
        if alerts:
            count_raised(alerts)
            alerts = await self.announce_alerts(alerts)
            await self.keep_alerts(alerts)

    async def keep_alerts(self, alerts: list[events.Alert]) -> None:
        """Every alert row, folded ones included (one row per event): into this process's store, or from
        a judge to the alert-rows topic, which the store stage stores."""
        if self.stage in ("judge", "attribute"):
            await self.publish(self.alert_rows_topic, alerts)
            self.alert_rows_sent += len(alerts)
        else:
            await self.store(topics.ALERTS, "alerts", [Decoded([], [], alerts)])

    async def judge_all_parked(self) -> None:
        try:
            await self.parked_due(everything=True)
        except Exception:  # a hand-over or a stop must go on
            log.exception("could not judge the parked run-queue waits")

    async def announce_alerts(self, alerts: list[events.Alert]) -> list[events.Alert]:
        """Group the alerts (streams/alert_groups.py); send the announced ones
        to the alerts topic and the notification targets; return them all,
        folded ones included, for the store (one row per event)."""
        alerts = self.alert_groups.offer(alerts, time.time_ns())
        out = [a for a in alerts if announced(a)]
        if out:
            await self.publish(self.alerts_topic, out)
            self.notifier.offer(out)  # only queues: a dead receiver never holds up the stream
        return alerts

    async def alert_groups_due(self, now_ns: int) -> None:
        """Resolve quiet alert groups and re-announce those still firing."""
        alerts = self.alert_groups.tick(now_ns)
        if alerts:
            await self.publish(self.alerts_topic, alerts)
            self.notifier.offer(alerts)
            await self.keep_alerts(alerts)

    async def publish(self, topic, records: Sequence[events.Record]) -> None:
        """NDJSON messages keyed by host, each below the broker's size limit."""
        by_host: dict[str, list[events.Record]] = {}
        for record in records:
            by_host.setdefault(record.host, []).append(record)
        for host, group in by_host.items():
            limit = self.settings.kafka_max_message_bytes
            for payload, _count in batches.split_lines(batches.encode_batch(group), limit):
                await self.outbox.send(topic, host.encode(), payload)

    def run(self) -> None:
        """Run the worker until SIGINT/SIGTERM."""
        worker = faust.Worker(self.app, loglevel="INFO", redirect_stdouts=False, logging_config=logs.DICT_CONFIG)
        try:
            worker.execute_from_commandline()
        finally:
            self.notifier.close()
            self.exporter.close()
            if self.stage in STAGE_FINAL_FILES:  # stopped, its producer flushed: what it published is final
                (self.settings.data_dir / STAGE_FINAL_FILES[self.stage]).write_text(json.dumps(
                    {"alert_rows": self.alert_rows_sent, "attributions": self.attributions_sent}))
            if self.stage in stages.STORING:
                state_file(self.settings.data_dir).unlink(missing_ok=True)
                self.sink.close()
