"""The one settings model. Every option is reachable by CLI flag (its own,
or --set NAME=VALUE), by environment variable (JITTERSCOPE_<NAME>, lists and
maps as JSON) and by a TOML config file (--config, or JITTERSCOPE_CONFIG).
Precedence: flag > env > file > default.

Each part has its own section, a plain model holding that part's fields, their
descriptions and validators; ``Settings`` is assembled from them and stays
flat, so a field's name is its TOML key, its variable and its --set NAME:

- ``KafkaSettings``: how every part talks to Kafka (bootstrap servers, producer
  and consumer options, message size).
- ``StoreSettings``: ClickHouse (or embedded chDB), the data directory and
  retention.
- ``CollectorSettings``: the collector (collector/): host name, what to watch,
  probes and their event thresholds, batching, spool, /metrics, OTLP receiver.
- ``StreamsSettings``: the streams worker (streams/): alert thresholds of the
  rules, request attribution, web port, ClickHouse sink.
- ``UpSettings``: the front door's ``up`` (embedded broker port, drain on stop).
"""

from __future__ import annotations

import json
import os
import socket
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsError, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from jitterscope.common import errors


#: sources the collector can run besides the run-queue probe
HARDWARE_PROBES = ("gpu_ioctl", "migrate", "pages", "blockio", "netdev")


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
    kafka_max_message_bytes: int = Field(
        900_000, ge=10_000, description="a Kafka message is split below this many bytes (brokers refuse > 1 MB)")


class StoreSettings(BaseModel):
    """Where the records are stored: ClickHouse (or embedded chDB) and local state."""

    clickhouse_url: str | None = Field(
        None, description="ClickHouse HTTP URL (http://user:pass@host:8123); unset = embedded chDB")
    data_dir: Path = Field(default_factory=default_data_dir, description="embedded ClickHouse and state")
    retention_days: dict[str, int] = Field(
        default_factory=dict,
        description='days each table keeps, e.g. {"runq_events": 30, "latency_minute": 400}; unset = forever')


class CollectorSettings(BaseModel):
    """The collector (collector/): what it watches, its probes, batching, spool, /metrics and OTLP receiver."""

    host: str = Field(default_factory=socket.gethostname, description="name this host's records carry")
    runq_threshold_ms: float = Field(5.0, gt=0, description="waits at or above this leave the kernel as events")
    serving_threshold_ms: float = Field(
        1.0, gt=0, description="event threshold for processes that send request spans (finer evidence)")
    hardware_probes: list[str] = Field(
        default_factory=lambda: list(HARDWARE_PROBES),
        description="hardware sources besides the run-queue probe (any of gpu_ioctl, migrate, pages, blockio, netdev)")
    gpu_ioctl_threshold_ms: float = Field(
        5.0, gt=0, description="GPU driver calls at or above this leave the kernel as events")
    gpu_device_patterns: list[str] = Field(
        default_factory=lambda: ["/dev/nvidia[0-9]*", "/dev/nvidia-uvm"],
        description="device paths whose ioctls are GPU driver calls (shell patterns)")
    target_pids: list[int] = Field(default_factory=list, description="processes to watch (default: all)")
    target_comms: list[str] = Field(
        default_factory=list, description="shell patterns of process names to watch (default: all)")
    batch_max_records: int = Field(500, ge=1, description="records per Kafka message at most")
    batch_max_delay_ms: int = Field(200, ge=1, description="a batch is sent at the latest after this")
    histogram_interval_s: float = Field(10.0, gt=0, description="how often histograms are published")
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
    request_id_attributes: list[str] = Field(
        default_factory=lambda: ["gen_ai.request.id"],
        description="span attributes holding the request ID, first found wins (else the trace ID)")

    @field_validator("target_comms")
    @classmethod
    def _no_empty_patterns(cls, value: list[str]) -> list[str]:
        if any(not p for p in value):
            raise ValueError("empty process-name pattern")
        return value

    @field_validator("hardware_probes")
    @classmethod
    def _known_probes(cls, value: list[str]) -> list[str]:
        unknown = [p for p in value if p not in HARDWARE_PROBES]
        if unknown:
            raise ValueError(f"unknown probe(s) {unknown}; known: {', '.join(HARDWARE_PROBES)}")
        return value

    @property
    def filters_targets(self) -> bool:
        return bool(self.target_pids or self.target_comms)


class StreamsSettings(BaseModel):
    """The streams worker (streams/): rule thresholds, request attribution, web port and ClickHouse sink."""

    runq_alert_ms: float = Field(10.0, gt=0, description="run-queue wait that raises an alert")
    gpu_ioctl_alert_ms: float = Field(50.0, gt=0, description="GPU driver call latency that raises an alert")
    migration_storm_per_s: float = Field(50.0, gt=0, description="migrations/s of one thread that raise an alert")
    numa_remote_share: float = Field(
        0.5, gt=0, le=1, description="share of an inference process's new pages on a node away from its GPU's "
                                     "that raises a numa_remote_memory alert")
    numa_remote_min_mb: float = Field(
        100.0, gt=0, description="new pages of one process per interval below which its placement is not judged (noise)")
    numa_filler_mb_per_s: float = Field(
        50.0, gt=0, description="page cache another process adds to a GPU's NUMA node that raises numa_node_filler")
    pcie_neighbour_mb_per_s: float = Field(
        200.0, gt=0, description="NVMe/NIC traffic on a GPU's PCIe switch that, with a slow GPU driver call, "
                                 "raises pcie_contention")
    attribution_grace_s: float = Field(
        2.0, gt=0, description="wait this long after a request's span ends for late kernel evidence")
    evidence_horizon_s: float = Field(300.0, gt=0, description="how much kernel evidence per host is kept for attribution")
    evidence_max_events: int = Field(
        200_000, ge=1000, description="kernel events per host kept for attribution at most (oldest go first)")
    pending_requests_max: int = Field(
        100_000, ge=1000, description="requests waiting for attribution at most (beyond it the oldest are attributed early)")
    request_slo_ms: float | None = Field(
        None, gt=0, description="request latency objective; unset = request_slo_factor x the rolling median")
    request_slo_factor: float = Field(5.0, gt=1, description="SLO as a multiple of the host's rolling median")
    baseline_min_samples: int = Field(20, ge=1, description="requests seen before the rolling median is trusted")
    streams_web_port: int = Field(6066, ge=0, description="streams worker web port: /metrics, /query")
    streams_web_bind: str = Field(
        "127.0.0.1", description="address the streams worker's web port listens on (/query always needs its token)")
    loss_alert_events: int = Field(
        1000, ge=1, description="events one host loses (kernel drops, spool drops) between two stats records "
                                "that raise an event_loss alert")
    sink_batch_rows: int = Field(5000, ge=1, description="rows per ClickHouse insert at most")
    sink_flush_s: float = Field(1.0, gt=0, description="ClickHouse inserts happen at least this often")


class UpSettings(BaseModel):
    """The front door's `up`: the embedded broker and shutdown."""

    broker_port: int = Field(29092, description="port of the embedded broker (0 = pick a free one)")
    drain_timeout_s: float = Field(
        120.0, gt=0, description="on stop, `up` waits at most this long for the worker to store what was sent")


#: the sections, in the order their fields appear in ``Settings``
SECTIONS: tuple[type[BaseModel], ...] = (KafkaSettings, StoreSettings, CollectorSettings, StreamsSettings, UpSettings)


# The front door's model: all sections in one flat model, so every field keeps
# its own name as TOML key, JITTERSCOPE_<NAME> variable and --set NAME=VALUE.
# Pydantic lists the fields of the last base first, hence the reversed order.
class Settings(UpSettings, StreamsSettings, CollectorSettings, StoreSettings, KafkaSettings, BaseSettings):

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
    """Settings from flags (``overrides``, None = not given), env and file."""
    if config_file is not None:
        if not config_file.is_file():
            raise errors.BadConfig(f"config file {config_file} does not exist")
        os.environ["JITTERSCOPE_CONFIG"] = str(config_file)
    env_file = os.environ.get("JITTERSCOPE_CONFIG")
    if env_file and not Path(env_file).is_file():
        raise errors.BadConfig(f"JITTERSCOPE_CONFIG={env_file} does not exist")
    given = {k: v for k, v in overrides.items() if v is not None and v != []}
    try:
        return Settings(**given)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise errors.BadConfig(f"bad configuration: {problems}") from exc
    except (SettingsError, tomllib.TOMLDecodeError) as exc:
        raise errors.BadConfig(
            f"bad configuration: {exc} (lists in JITTERSCOPE_* variables are JSON, e.g. '[1, 2]')") from exc


def to_env(s: Settings) -> dict[str, str]:
    """The settings as JITTERSCOPE_* variables, so child processes see exactly
    what the parent resolved (flags included)."""
    env = {}
    for name, value in s.model_dump(mode="json").items():
        if value is None:
            continue
        env[f"JITTERSCOPE_{name.upper()}"] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return env
