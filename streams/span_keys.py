# SPDX-License-Identifier: Apache-2.0
"""The keys of attributed request spans (streams/attribution.py)."""

from __future__ import annotations

from typing import Protocol


class Keyed(Protocol):  # read-only: a record's fields
    @property
    def host(self) -> str: ...

    @property
    def boot_id(self) -> str: ...

    @property
    def seq(self) -> int: ...


class SpanKeys:
    """Keys (host, boot_id, seq) of spans attributed, oldest first, at most
    ``limit`` of them: a span Kafka redelivers, a restart re-reads or a
    partition's next owner reads again (streams/attribution_stage.py) is not
    attributed, stored and counted twice."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._keys: dict[tuple[str, str, int], None] = {}

    def add(self, record: Keyed) -> None:
        self._keys[(record.host, record.boot_id, record.seq)] = None
        if len(self._keys) > self.limit:
            del self._keys[next(iter(self._keys))]

    def __contains__(self, record: Keyed) -> bool:
        return (record.host, record.boot_id, record.seq) in self._keys
