# SPDX-License-Identifier: Apache-2.0
"""What the rules share: their thresholds (all from StreamsSettings) and the
Alert builder and GPU look-up the hardware rules use.

Each remedy names this host's own nodes, CPUs and devices: the GPU's NUMA
node and its CPU list, the switch a GPU shares with an NVMe drive, the node
a noisy job should move to.
"""

from __future__ import annotations

from dataclasses import dataclass

from jitterscope.common.settings import StreamsSettings
from jitterscope.schemas.events import Alert, Topology
from jitterscope.schemas.topology import cpus_of_node, gpu_by_address, gpu_node

MB = 1 << 20
PAGE = 4096


@dataclass(frozen=True)
class Thresholds:
    """The rules' thresholds in the units they compare in. Every value comes
    from StreamsSettings (see there for what each means); build with
    ``from_settings`` (or ``defaults()``), never by hand."""

    runq_alert_ns: int  # runq_alert_ms
    loss_alert_events: int  # loss_alert_events
    gpu_ioctl_ns: int  # gpu_ioctl_alert_ms: a driver call this slow stalls the GPU feed
    migrations_per_s: float  # migration_storm_per_s: a thread hopping cores this often loses its caches
    remote_share: float  # numa_remote_share: of an inference process's new pages away from its GPU
    remote_min_pages: int  # numa_remote_min_mb: below that, placement is noise
    filler_bytes_per_s: float  # numa_filler_mb_per_s: page cache another process adds to a GPU's node
    neighbour_bytes_per_s: float  # pcie_neighbour_mb_per_s: NVMe/NIC traffic that contends on a shared switch
    irq_share: float  # irq_alert_share: of one CPU taken by one interrupt source
    cfs_throttle_ns: int  # cfs_throttle_alert_ms: throttled time of a serving cgroup per interval

    @classmethod
    def from_settings(cls, s: StreamsSettings) -> "Thresholds":
        return cls(
            runq_alert_ns=int(s.runq_alert_ms * 1_000_000),
            loss_alert_events=s.loss_alert_events,
            gpu_ioctl_ns=int(s.gpu_ioctl_alert_ms * 1e6),
            migrations_per_s=s.migration_storm_per_s,
            remote_share=s.numa_remote_share,
            remote_min_pages=int(s.numa_remote_min_mb * MB) // PAGE,
            filler_bytes_per_s=s.numa_filler_mb_per_s * MB,
            neighbour_bytes_per_s=s.pcie_neighbour_mb_per_s * MB,
            irq_share=s.irq_alert_share,
            cfs_throttle_ns=int(s.cfs_throttle_alert_ms * 1e6),
        )

    @classmethod
    def defaults(cls) -> "Thresholds":
        """The settings' defaults (no environment, no config file)."""
        return cls.from_settings(StreamsSettings.model_construct())


def alert(record, kind: str, severity: str, pid: int, comm: str, summary: str, remedy: str, now_ns: int,
          evidence: dict[str, str], tid: int = 0, cpus_allowed: list[int] | None = None,
          duration_ns: int = 0) -> Alert:
    return Alert(host=record.host, boot_id=record.boot_id, seq=record.seq, ts_ns=record.ts_ns, raised_ns=now_ns,
                 kind=kind, severity=severity, pid=pid, tid=tid, comm=comm, cpu=0, wait_ns=duration_ns,
                 suspect_pid=0, suspect_comm="", cpus_allowed=cpus_allowed or [], summary=summary,
                 remedy=remedy, evidence=evidence)


def gpu_context(topo: Topology, gpus: list[str]) -> tuple[str, int, list[int]]:
    """The process's first GPU, its node and that node's CPUs (or "", -1, [])."""
    for address in gpus:
        if gpu_by_address(topo, address):
            node = gpu_node(topo, address)
            return address, node, cpus_of_node(topo, node) if node >= 0 else []
    return "", -1, []
