# SPDX-License-Identifier: Apache-2.0
"""The one settings model. Every option is reachable by CLI flag (its own, or --set NAME=VALUE), by environment
variable (JITTERSCOPE_<NAME>, lists and maps as JSON) and by a TOML config file (--config, or JITTERSCOPE_CONFIG).
Precedence: flag > env > file > default.

Each part has its own section, a plain model holding that part's fields, their descriptions and validators;
``Settings`` is assembled from them and stays flat, so a field's name is its TOML key, its variable and its --set
NAME:

- ``KafkaSettings``: how every part talks to Kafka (bootstrap servers, producer and consumer options, message size).
- ``StoreSettings``: ClickHouse (or embedded chDB), the data directory and retention.
- ``CollectorSettings``: the collector (collector/): host name, what to watch, probes and their event thresholds,
  batching, spool, /metrics, OTLP receiver.
- ``StreamsSettings``: the streams worker (streams/): alert thresholds of the rules, request attribution, web port,
  ClickHouse sink.
- ``ExportSettings`` (common/export_settings.py): what goes out to other tools: alert notifications, attribution
  spans over OTLP.
- ``UpSettings`` (common/up_settings.py): the front door's ``up`` (embedded broker, its stages, drain on stop).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tomllib
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError,
                               TomlConfigSettingsSource)

from jitterscope.common import errors
from jitterscope.common.export_settings import ExportSettings
from jitterscope.common.up_settings import UpSettings

# the probe names are the signal catalogue's (settings may read schemas: records and facts, no I/O)
from jitterscope.schemas.signals import HARDWARE_PROBES, PROBE_ALIASES

log = logging.getLogger(__name__)

#: the collector's last counts, written as it exits, read by `up` (to compare
#: with what was stored) and by `doctor`: in the data directory
FINAL_FILE = "collector-final.json"


def default_data_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/jitterscope")
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local/share")) / "jitterscope"


class KafkaSettings(BaseModel):
    """How every part talks to Kafka."""

    bootstrap_servers: str | None = Field(
        None, description="Kafka bootstrap servers; unset = spawn the embedded broker")
    kafka_idempotence: bool | None = Field(
        None, description="idempotent producer; unset = on, except on the embedded broker (Tansu loses "
                          "producer state on restart and an idempotent producer would never recover)")
    kafka_session_timeout_s: float = Field(10.0, description="consumer-group session timeout")
    kafka_fetch_max_wait_ms: int = Field(
        100, ge=1, le=10_000, description="longest a consumer fetch waits for data (bounds alert delay)")
    kafka_fetch_busy_wait_ms: int = Field(
        20, ge=1, le=10_000, description="the streams worker's fetch wait right after a fetch that brought "
                                         "records (the embedded broker holds every fetch its full wait)")
    kafka_max_message_bytes: int = Field(
        900_000, ge=10_000, description="a Kafka message is split below this many bytes (brokers refuse > 1 MB)")
    # Topics: every topic gets the same count (records are keyed by host, and one worker must own all of a
    # host's topics), so the count bounds the number of streams workers that share the work.
    kafka_partitions: int = Field(
        4, ge=1, description="partitions of every jitterscope topic (at most this many streams workers share "
                             "the work); `jitterscope topics create` makes them, workers refuse a mismatch")
    kafka_replication_factor: int = Field(
        1, ge=1, description="replicas of every jitterscope topic `jitterscope topics create` makes (3 on a "
                             "production cluster)")
    # Security: mapped to librdkafka (collector, topics, up) and to aiokafka through Faust (streams) by
    # common/kafka_auth.py. The password is a SecretStr: it never shows in repr, logs or --help.
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka security.protocol")
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="SASL mechanism (with SASL_PLAINTEXT or SASL_SSL)")
    kafka_sasl_username: str | None = Field(None, description="SASL user name")
    kafka_sasl_password: SecretStr | None = Field(
        None, description="SASL password (prefer kafka_sasl_password_file or JITTERSCOPE_KAFKA_SASL_PASSWORD)")
    kafka_sasl_password_file: Path | None = Field(
        None, description="file holding the SASL password (e.g. a mounted Kubernetes Secret)")
    kafka_ssl_ca_file: Path | None = Field(None, description="CA bundle (PEM) that signed the brokers' certificates")
    kafka_ssl_cert_file: Path | None = Field(None, description="client certificate (PEM) for mutual TLS")
    kafka_ssl_key_file: Path | None = Field(None, description="client private key (PEM) for mutual TLS")

    @model_validator(mode="after")
    def _kafka_security_complete(self):
        sasl = self.kafka_security_protocol.startswith("SASL_")
        if sasl and not (self.kafka_sasl_mechanism and self.kafka_sasl_username
                         and (self.kafka_sasl_password or self.kafka_sasl_password_file)):
            raise ValueError(f"kafka_security_protocol={self.kafka_security_protocol} needs kafka_sasl_mechanism, "
                             "kafka_sasl_username and kafka_sasl_password (or kafka_sasl_password_file)")
        if not sasl and self.kafka_sasl_mechanism:
            raise ValueError("kafka_sasl_mechanism is set but kafka_security_protocol is "
                             f"{self.kafka_security_protocol}: use SASL_SSL (or SASL_PLAINTEXT)")
        if bool(self.kafka_ssl_cert_file) != bool(self.kafka_ssl_key_file):
            raise ValueError("mutual TLS needs both kafka_ssl_cert_file and kafka_ssl_key_file")
        return self


class StoreSettings(BaseModel):
    """Where the records are stored: ClickHouse (or embedded chDB) and local state."""

    clickhouse_url: str | None = Field(
        None, description="ClickHouse HTTP URL (http://user:pass@host:8123); unset = embedded chDB")
    data_dir: Path = Field(default_factory=default_data_dir, description="embedded ClickHouse and state")
    clickhouse_cluster: str | None = Field(
        None, pattern=r"^[\w.{}-]+$",
        description="ClickHouse cluster name: the schema is the operator's (`jitterscope schema --cluster NAME`), "
                    "the worker applies retention ON CLUSTER to the *_local tables")
    retention_days: dict[str, int] = Field(
        default_factory=dict,
        description='days each table keeps, e.g. {"runq_events": 30, "latency_minute": 400}; unset = forever')

    @field_validator("clickhouse_url")
    @classmethod
    def _clickhouse_url(cls, value: str | None) -> str | None:  # a name of its own: Settings merges all sections
        # clickhouse-connect reads "notaurl" as no host and quietly goes to localhost:8123
        if value is not None:
            from urllib.parse import urlparse

            url = urlparse(value)
            try:
                url.port  # raises on a port that is not a number
            except ValueError as exc:
                raise ValueError(f"{value!r} has a bad port ({exc})") from exc
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(f"{value!r} is not an http:// or https:// URL with a host, "
                                 "e.g. http://default:secret@clickhouse:8123")
        return value


class CollectorSettings(BaseModel):
    """The collector (collector/): what it watches, its probes, batching, spool, /metrics and OTLP receiver."""

    host: str = Field(default_factory=socket.gethostname, description="name this host's records carry")
    runq_threshold_ms: float = Field(5.0, gt=0, description="waits at or above this leave the kernel as events")
    serving_threshold_ms: float = Field(
        1.0, gt=0, description="event threshold for processes that send request spans (finer evidence)")
    # vLLM V1 emits spans from the API server while its EngineCore and GPU workers are child processes; in
    # a container, every process of the serving container counts. "auto" covers both: tree, plus the span
    # process's cgroup when that process is in a container (own PID namespace or a container ID).
    # "cgroup" alone suits a systemd unit on a bare host; on a login session it would sweep in the session.
    serving_group: Literal["auto", "process", "tree", "cgroup"] = Field(
        "auto", description="which processes a request's evidence comes from: process (the span's only), tree "
                            "(and its descendants), cgroup (and its cgroup's processes), auto (tree, plus the "
                            "container's processes when the span process runs in a container)")
    own_tree_pid: int = Field(
        0, ge=0, description="a process whose tree is jitterscope's own (`up` sets itself: the broker, worker and "
                             "collector); its processes, and the collector itself always, are never alert victims "
                             "and are labelled 'jitterscope:' wherever they are suspects (0: the collector alone)")
    own_cpus: list[int] = Field(
        default_factory=list, description="jitterscope's own CPUs (housekeeping CPUs): the collector's threads, "
                                          "and under `up` the broker and worker, run only there (empty: anywhere)")
    collector_policy: Literal["normal", "batch", "idle"] = Field(
        "normal", description="the collector's CPU scheduling policy: idle (SCHED_IDLE) never takes a CPU a server "
                              "wants, but may lose events while the CPUs stay busy (up to 3% beside a real vLLM "
                              "on 2 CPUs); batch (SCHED_BATCH) never preempts on wakeup")
    runq_stacks: bool = Field(
        True, description="capture the culprit's and the starved thread's stacks for run-queue waits of "
                          "runq_alert_ms or more (off: no stack walks, no symbolization; alerts name no stacks)")
    self_cost_target_pct: float = Field(
        0.5, gt=0, le=100, description="what watching may cost a host, in percent of all its CPU time (BPF run "
                                       "time plus the collector): `doctor` and the report's 'Cost of watching' "
                                       "judge the measured cost against it")
    hardware_probes: list[str] = Field(
        default_factory=lambda: list(HARDWARE_PROBES),
        description=f"hardware sources besides the run-queue probe (any of {', '.join(HARDWARE_PROBES)})")
    gpu_ioctl_threshold_ms: float = Field(
        5.0, gt=0, description="GPU driver calls at or above this leave the kernel as events")
    blocked_threshold_ms: float = Field(
        1.0, gt=0, description="serving-group threads blocked (asleep off the CPU: on the GIL, memory, I/O or any "
                               "other sleep) at least this long leave the kernel as events")
    gpu_device_patterns: list[str] = Field(
        default_factory=lambda: ["/dev/nvidia[0-9]*", "/dev/nvidia-uvm"],
        description="device paths whose ioctls are GPU driver calls (shell patterns)")
    target_pids: list[int] = Field(default_factory=list, description="processes to watch (default: all)")
    target_comms: list[str] = Field(
        default_factory=list, description="shell patterns of process names to watch (default: all)")
    batch_max_records: int = Field(500, ge=1, description="records per Kafka message at most")
    batch_max_delay_ms: int = Field(200, ge=1, description="a batch is sent at the latest after this")
    batch_alerts_at_once: bool = Field(
        True, description="a run-queue wait of runq_alert_ms or more sends every pending batch at once, not after "
                          "batch_max_delay_ms (its alert is raised sooner; an idle host sends no more than before)")
    histogram_interval_s: float = Field(10.0, gt=0, description="how often histograms are published")
    irq_interval_s: float = Field(
        0.25, gt=0, description="how often IRQ time per CPU is published (short: it is charged to waits of ms)")
    irq_min_share: float = Field(
        0.01, ge=0, lt=1, description="IRQ/softirq sources under this share of a CPU in an interval are not "
                                      "published (the timer tick on every CPU; 0 = every non-zero source)")
    cfs_interval_s: float = Field(
        0.25, gt=0, description="how often the CFS throttling of quota cgroups is published (short: it is "
                                "charged to waits of ms)")
    nvml_interval_s: float = Field(
        1.0, gt=0, description="how often each GPU's NVML telemetry (clocks, throttle reasons, temperature, power, "
                               "PCIe, NVLink errors) is read, where nvidia-ml-py and a driver are present")
    serving_metrics_urls: list[str] = Field(
        default_factory=list, description="the serving engines' Prometheus endpoints on this host (vLLM: "
                                          "http://127.0.0.1:8000/metrics), read for their queue, KV cache, TTFT and "
                                          "inter-token latency beside the causes (none: not read)")
    serving_metrics_interval_s: float = Field(15.0, gt=0, description="how often serving_metrics_urls are read")
    topology_interval_s: float = Field(60.0, gt=0, description="how often the topology is re-published")
    target_rescan_s: float = Field(2.0, gt=0, description="how often target_comms are matched against /proc")
    collector_metrics_port: int = Field(9464, ge=0, description="Prometheus /metrics of the collector (0 = off)")
    collector_metrics_bind: str = Field(
        "127.0.0.1", description="address the collector's /metrics listens on (0.0.0.0 for a remote Prometheus)")
    spool_max_mb: int = Field(
        256, ge=0, description="on-disk spool for batches Kafka cannot take during an outage (0 = off); "
                               "when full, batches are dropped and counted")
    otlp_port: int = Field(4318, ge=0, description="collector's OTLP/HTTP receiver for request spans (0 = off)")
    otlp_bind: str = Field("127.0.0.1", description="address the OTLP receiver listens on (0.0.0.0 for remote senders)")
    otlp_max_connections: int = Field(64, ge=1, description="OTLP connections served at once; more wait")
    otlp_read_timeout_s: float = Field(
        10.0, gt=0, description="an OTLP client that does not send its whole request in this time gets 408")
    otlp_trusted_relays: list[str] = Field(
        default_factory=list,
        description="OTLP relays whose spans may name other processes and containers (process.pid, "
                    "container.id, k8s.pod.uid): on-host ones by process name (comm, e.g. otelcol-contrib) or "
                    "executable path (/usr/bin/otelcol-contrib), others by the address or network they send from "
                    "(10.0.3.7, 10.0.3.0/28; never loopback); any other on-host sender is charged its own spans, "
                    "and a claim from anyone else is ignored (host level)")
    # any local process may send spans: bounds on what one sender costs (collector/intake.py)
    otlp_max_spans_per_request: int = Field(2048, ge=1, description="spans taken from one OTLP body; the rest shed")
    otlp_sender_spans_per_s: float = Field(
        2000.0, gt=0, description="spans a sender (its uid on this host, else its address) may send per second")
    otlp_sender_burst_spans: int = Field(8192, ge=1, description="spans a sender may send at once above its rate")
    otlp_queue_max_spans: int = Field(20000, ge=1, description="request spans waiting for the collector's loop")
    serving_heads_per_sender: int = Field(
        16, ge=1, description="span processes one sender may make serving heads (probe targets with their groups)")
    serving_targets_max: int = Field(
        2048, ge=1, description="serving-group processes watched on the host at most (the earliest heads' first)")
    request_id_attributes: list[str] = Field(
        default_factory=lambda: ["gen_ai.request.id"],
        description="span attributes holding the request ID, first found wins (else the trace ID)")
    # In a pod the host's filesystem is mounted elsewhere (hostPath / at /host):
    # the host's /proc and /sys are then <host_root>/proc and <host_root>/sys.
    host_root: Path = Field(
        Path("/"), description="where the host's / is mounted: its /proc and /sys are read under it "
                               "(like node exporter's --path.procfs; /host in a container)")
    kubelet_url: str = Field(
        "", description="kubelet to name pods from its pod list, e.g. https://$NODE_IP:10250 or "
                        "http://127.0.0.1:10255 (\"\" = off: pods are named by UID)")
    kubelet_token_file: Path | None = Field(
        Path("/var/run/secrets/kubernetes.io/serviceaccount/token"),
        description="bearer token sent to the kubelet (the pod's service account; needs nodes/proxy get)")
    kubelet_insecure_tls: bool = Field(
        False, description="accept the kubelet's self-signed serving certificate")

    @field_validator("host_root")
    @classmethod
    def _absolute_root(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError(f"host_root must be an absolute path, not {value}")
        return value

    @field_validator("target_comms")
    @classmethod
    def _no_empty_patterns(cls, value: list[str]) -> list[str]:
        if any(not p for p in value):
            raise ValueError("empty process-name pattern")
        return value

    @field_validator("hardware_probes")
    @classmethod
    def _known_probes(cls, value: list[str]) -> list[str]:
        for old in set(value) & set(PROBE_ALIASES):
            log.warning("hardware_probes: %r is now called %r; the old name goes in the next release",
                        old, PROBE_ALIASES[old])
        value = list(dict.fromkeys(PROBE_ALIASES.get(p, p) for p in value))
        unknown = [p for p in value if p not in HARDWARE_PROBES]
        if unknown:
            raise ValueError(f"unknown probe(s) {unknown}; known: {', '.join(HARDWARE_PROBES)}")
        return value

    @property
    def filters_targets(self) -> bool:
        return bool(self.target_pids or self.target_comms)


class StreamsSettings(BaseModel):
    """The streams worker (streams/): rules, request attribution, web port, ClickHouse sink, alert grouping."""

    runq_alert_ms: float = Field(10.0, gt=0, description="run-queue wait that raises an alert")
    gpu_ioctl_alert_ms: float = Field(50.0, gt=0, description="GPU driver call latency that raises an alert")
    irq_alert_share: float = Field(
        0.2, gt=0, le=1, description="share of one CPU taken by one interrupt source in an interval that raises irq")
    cfs_throttle_alert_ms: float = Field(
        10.0, gt=0, description="CFS throttled time of a serving cgroup in one interval that raises cfs_throttling")
    migration_storm_per_s: float = Field(50.0, gt=0, description="migrations/s of one thread that raise an alert")
    numa_remote_share: float = Field(
        0.5, gt=0, le=1, description="share of an inference process's new pages away from its GPU's node that alerts")
    numa_remote_min_mb: float = Field(
        100.0, gt=0, description="new pages of one process per interval below which its placement is not judged "
                                 "(noise)")
    numa_filler_mb_per_s: float = Field(
        50.0, gt=0, description="page cache another process adds to a GPU's NUMA node that raises numa_node_filler")
    pcie_neighbour_mb_per_s: float = Field(
        200.0, gt=0,
        description="NVMe/NIC traffic on a GPU's PCIe switch that, with a slow driver call, is pcie_contention")
    attribution_grace_s: float = Field(
        2.0, gt=0, description="wait this long after a request's span ends for late kernel evidence")
    evidence_horizon_s: float = Field(300.0, gt=0, description="how much kernel evidence per host attribution keeps")
    evidence_max_events: int = Field(
        200_000, ge=1000, description="kernel events per host kept for attribution at most (oldest go first)")
    pending_requests_max: int = Field(
        100_000, ge=1000, description="requests waiting for attribution at most (past it the oldest go early)")
    request_slo_ms: float | None = Field(
        None, gt=0, description="request latency objective; unset = request_slo_factor x the rolling median")
    request_slo_factor: float = Field(5.0, gt=1, description="SLO as a multiple of the host's rolling median")
    ttft_slo_ms: dict[str, float] = Field(
        default_factory=dict, description="time-to-first-token objective per model name (its span's "
                                          "gen_ai.response.model; shell patterns, \"*\" for any): a request over "
                                          "it raises request_slo, its phases say what took the time")
    itl_slo_ms: dict[str, float] = Field(
        default_factory=dict, description="objective for the mean time between output tokens (decode time over the "
                                          "tokens after the first), per model name like ttft_slo_ms")
    baseline_min_samples: int = Field(20, ge=1, description="requests seen before the rolling median is trusted")
    streams_web_port: int = Field(6066, ge=0, description="streams worker web port: /metrics, /query")
    streams_web_bind: str = Field(
        "127.0.0.1", description="address the streams worker's web port listens on (/query always needs its token)")
    streams_stage: Literal["all", "judge", "attribute", "store", "attribute-store"] = Field(
        "all", description="what a streams process does, in its own consumer group (streams/stages.py): all, judge, "
                           "attribute (requests joined with evidence), store (into ClickHouse), attribute-store")
    judge_web_port: int = Field(
        0, ge=0, description="the judge stage's web port: /metrics only (0 = off; under `up`, any free port)")
    attribute_web_port: int = Field(0, ge=0, description="the attribution stage's /metrics port (0: off; `up`: any)")
    judge_replay_s: float = Field(
        600.0, gt=0, description="on taking partitions, the judge and attribution stages re-read this much of the "
                                 "topology, process and device-traffic topics to learn their hosts again")
    metrics_comms_max: int = Field(
        20, ge=1, description="process names with their own series in the streams worker's latency histograms on "
                              "/metrics; later ones are counted as comm=\"other\" (bounds Prometheus cardinality)")
    loss_alert_events: int = Field(
        1000, ge=1, description="events one host loses (kernel drops, spool drops) between two stats records "
                                "that raise an event_loss alert")
    # 50k, not 5k: chDB inserts far faster in big batches (bench/run.py sink-batch: 1.12-1.34x capacity)
    sink_batch_rows: int = Field(50_000, ge=1, description="rows per ClickHouse insert at most")
    sink_flush_s: float = Field(1.0, gt=0, description="ClickHouse inserts happen at least this often")
    alert_group_window_s: float = Field(
        60.0, gt=0, description="run-queue/throttling/IRQ alerts of one (host, victim, kind, suspect) group are "
                                "announced at most once per this window; repeats are folded into the group")
    alert_group_quiet_s: float = Field(120.0, gt=0, description="a group with no new alert for this long is resolved")
    announce_comms: list[str] = Field(
        default_factory=lambda: ["jsvictim"],
        description="process-name patterns whose run-queue waits are announced (console, notifications) besides "
                    "serving groups', GPU holders' and target_comms/target_pids'; the others' alerts are only "
                    "stored, marked quiet (default: `jitterscope demo`'s victim; [\"*\"]: every process's)")
    alert_groups_max: int = Field(
        10_000, ge=1, description="open alert groups at most (beyond it the longest quiet is resolved early)")


#: the sections, in the order their fields appear in ``Settings``
SECTIONS: tuple[type[BaseModel], ...] = (KafkaSettings, StoreSettings, CollectorSettings, StreamsSettings,
                                         ExportSettings, UpSettings)


# The front door's model: all sections in one flat model, so every field keeps
# its own name as TOML key, JITTERSCOPE_<NAME> variable and --set NAME=VALUE.
# Pydantic lists the fields of the last base first, hence the reversed order.
class Settings(UpSettings, ExportSettings, StreamsSettings, CollectorSettings, StoreSettings, KafkaSettings,
               BaseSettings):

    model_config = SettingsConfigDict(env_prefix="JITTERSCOPE_", extra="forbid")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get("JITTERSCOPE_CONFIG")
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
        return tuple(sources)


def load(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Settings from flags (``overrides``, None = not given: an empty list is
    given, and empties the setting), env and file."""
    if config_file is not None:
        _check_config_file(Path(config_file), "config file")
        os.environ["JITTERSCOPE_CONFIG"] = str(config_file)
    elif env_file := os.environ.get("JITTERSCOPE_CONFIG"):
        _check_config_file(Path(env_file), "JITTERSCOPE_CONFIG file")
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors())
        raise errors.BadConfig(f"bad configuration: {problems}") from exc
    except (SettingsError, tomllib.TOMLDecodeError) as exc:
        raise errors.BadConfig(
            f"bad configuration: {exc} (lists in JITTERSCOPE_* variables are JSON, e.g. '[1, 2]')") from exc


def _check_config_file(path: Path, what: str) -> None:
    """Read and parse the TOML file up front, so each way it can be wrong is
    one line naming the file (and the line), not pydantic's wording."""
    try:
        tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise errors.BadConfig(f"{what} {path} does not exist") from exc
    except IsADirectoryError as exc:
        raise errors.BadConfig(f"{what} {path} is a directory, not a TOML file") from exc
    except PermissionError as exc:
        raise errors.BadConfig(f"{what} {path} is not readable by this user (permission denied)") from exc
    except UnicodeDecodeError as exc:
        raise errors.BadConfig(f"{what} {path} is not UTF-8 text: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        where = str(exc)
        if "end of document" in where:  # tomllib names no line there: the last one
            where += f", line {len(path.read_text(encoding='utf-8').splitlines())}"
        raise errors.BadConfig(f"{what} {path} is not valid TOML: {where}") from exc


def _problem(error: Mapping[str, Any]) -> str:
    """One validation error as ``name: why``; list and map settings say
    how to write them on the command line and in the environment."""
    name = ".".join(str(p) for p in error["loc"])
    text = f"{name}: {error['msg']}"
    if error["type"] in ("list_type", "dict_type") and len(error["loc"]) == 1:
        example = '["a", "b"]' if error["type"] == "list_type" else '{"key": 1}'
        text += (f" (a {'list' if error['type'] == 'list_type' else 'map'} is JSON in --set and JITTERSCOPE_* "
                 f"variables: --set '{name}={example}' or JITTERSCOPE_{name.upper()}='{example}')")
    return text


def to_env(s: Settings) -> dict[str, str]:
    """The settings as JITTERSCOPE_* variables, so child processes see exactly
    what the parent resolved (flags included)."""
    env = {}
    for name, value in s.model_dump(mode="json").items():
        if value is None:
            continue
        secret = getattr(s, name)
        if isinstance(secret, SecretStr):  # the dump masks it; a child needs the real value
            value = secret.get_secret_value()
        env[f"JITTERSCOPE_{name.upper()}"] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return env


#: defaults that depend on the machine: the example names them instead
MACHINE_DEFAULTS = {"host": "this machine's host name",
                    "data_dir": "/var/lib/jitterscope as root, else ~/.local/share/jitterscope"}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        pairs = ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items())
        return "{ " + pairs + " }" if value else "{}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def example_toml() -> str:
    """Every setting with its description and default, section by section,
    commented out: deploy/jitterscope.example.toml is this text
    (`jitterscope config --example`; tests/unit/common/test_settings_example.py
    keeps the file current)."""
    import textwrap

    lines = ["# jitterscope settings: every key is also a JITTERSCOPE_<KEY> variable (lists and maps as JSON)",
             "# and a flag (--set KEY=VALUE). Precedence: flag > environment > this file > default.",
             "# Generated from common/settings.py by `jitterscope config --example`; do not edit by hand.",
             "# Uncomment what you change; a key left out keeps its default."]
    for section in SECTIONS:
        lines += ["", f"# == {section.__name__}: {(section.__doc__ or section.__name__).strip().splitlines()[0]}"]
        for name, field in section.model_fields.items():
            lines += [""] + textwrap.wrap(field.description or name, 100, initial_indent="# ",
                                          subsequent_indent="# ")
            if name in MACHINE_DEFAULTS:
                lines.append(f"# {name} = ...   (default: {MACHINE_DEFAULTS[name]})")
                continue
            default = field.get_default(call_default_factory=True)
            if default is None:
                lines.append(f"# {name} is unset by default")
            else:
                lines.append(f"# {name} = {toml_value(default)}")
    return "\n".join(lines) + "\n"
