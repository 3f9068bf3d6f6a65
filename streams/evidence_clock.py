# SPDX-License-Identifier: Apache-2.0
"""How far each host's kernel evidence has come: when a request may be
attributed before its grace period is over (streams/attribution.py).

A request is attributed once every kind of evidence its host has been
sending lately (run-queue waits, blocked time, throttling, interrupts, GPU
driver calls: each kind whose newest record is at most ``ACTIVE_NS`` older
than the request's end)
has reached ``MARGIN_NS`` past its end, or one of them ``LAG_NS`` past it
(a kind that sends only now and then: interrupt sources under 1% of a CPU
are not sent). Each kind comes in order on its
topic partition (one host's records are one partition, in the order the
collector sent them), so once a record that new has come, the evidence that
overlapped the request has come too; the margin covers a wait that ended a
little after the request did, and the collector's read of several CPUs'
buffers out of order. A host that goes quiet, or a kind that is late, falls
back to the grace period (``attribution_grace_s``): later, never wrong.

Why: the grace period alone held every request alert ``attribution_grace_s``
(2 s) and more after its request ended, when the evidence had come within a
few hundred ms (the collector's batches leave at most every 200 ms, its
interval records every 250 ms). The GPU's own reports (Xid errors, NVML
telemetry every second) do not hold a request: they name a GPU cause, they
do not charge time.
"""

from __future__ import annotations

from collections import defaultdict

#: how far past a request's end each active kind must have come
MARGIN_NS = 100_000_000
#: once any kind has come this far past a request's end, a kind that has not is taken to have nothing
#: for it: an interval record (interrupts, throttling: every 250 ms) that covers the end leaves the
#: collector within its batch delay (200 ms) after its interval
LAG_NS = 450_000_000
#: a kind whose newest record is older than this at a request's end is not waited for: it is not
#: flowing now (a host's page placement comes every histogram interval, 10 s; a cgroup that stopped running)
ACTIVE_NS = 1_000_000_000


class EvidenceClock:
    """host -> evidence kind -> the newest ``ts_ns`` seen of it."""

    def __init__(self, margin_ns: int = MARGIN_NS, active_ns: int = ACTIVE_NS, lag_ns: int = LAG_NS) -> None:
        self.margin_ns, self.active_ns, self.lag_ns = margin_ns, active_ns, lag_ns
        self._newest: dict[str, dict[type, int]] = defaultdict(dict)

    def saw(self, records: list) -> None:
        """Records of one kind (a message's), of one host or several."""
        if not records:
            return
        kind, newest = type(records[0]), dict[str, int]()
        for record in records:  # one pass: the newest of each host
            if record.ts_ns > newest.get(record.host, 0):
                newest[record.host] = record.ts_ns
        for host, ts_ns in newest.items():
            self._advance(host, kind, ts_ns)

    def _advance(self, host: str, kind: type, ts_ns: int) -> None:
        kinds = self._newest[host]
        if ts_ns > kinds.get(kind, 0):
            kinds[kind] = ts_ns

    def past(self, host: str, end_ns: int) -> bool:
        """Whether every kind the host sent lately has come ``margin_ns``
        past ``end_ns``, or one kind ``lag_ns`` past it."""
        kinds = self._newest.get(host)
        if not kinds:
            return False
        if max(kinds.values()) >= end_ns + self.lag_ns:
            return True
        active = [ts for ts in kinds.values() if ts >= end_ns - self.active_ns]
        return bool(active) and min(active) >= end_ns + self.margin_ns

    def forget(self, host: str) -> None:
        self._newest.pop(host, None)
