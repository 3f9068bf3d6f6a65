# SPDX-License-Identifier: Apache-2.0
"""Fuzzed records of every input type: whatever the decoder accepts fits its
ClickHouse columns (real chDB takes it), and nothing it is given makes it
raise -- so one mutated record can never fail a whole insert."""

from __future__ import annotations

import random

import msgspec
import pytest

from jitterscope.schemas import batches, topics
from jitterscope.streams import clickhouse
from tests.integration.test_streams_faults import example

pytestmark = pytest.mark.integration

NASTY_NUMBERS = [-1, -(2**31) - 1, 2**15, 2**16, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, 2**64 + 1, 10**30, 1.5,
                 float("1e308"), True, None, "7", [], {}]


def mutate(record: dict, rng: random.Random) -> bytes:
    """A record with one field replaced by a nasty value, or its JSON bytes damaged."""
    record = dict(record)
    roll = rng.random()
    if roll < 0.6:
        field = rng.choice([k for k in record if k != "v"])
        record[field] = rng.choice(NASTY_NUMBERS + [[rng.choice(NASTY_NUMBERS)], "\x1b[31m\u202e" * 3])
        try:
            return msgspec.json.encode(record)
        except (OverflowError, msgspec.EncodeError):
            return repr(record).encode()
    raw = bytearray(msgspec.json.encode(record))
    for _ in range(rng.randint(1, 4)):
        position = rng.randrange(len(raw))
        raw[position] = rng.choice(b'0123456789-",:{}[]e.\\\x00\xff')
    return bytes(raw)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    client = clickhouse.connect(None, tmp_path_factory.mktemp("fuzz"))
    clickhouse.migrate(client)
    yield client
    client.close()


@pytest.mark.parametrize("topic", sorted(topics.INPUT_TOPICS))
def test_what_decodes_from_fuzzed_records_always_fits_its_table(store, topic):
    record_type = topics.INPUT_TOPICS[topic]
    rng = random.Random(f"fuzz-{topic}")
    decoder = batches.BatchDecoder(record_type)
    accepted = 0
    for batch in range(20):
        lines = [mutate(example(record_type, "fuzz", batch * 100 + i), rng) for i in range(50)]
        good, bad = decoder.decode(b"\n".join(lines))
        assert len(good) + len(bad) == len(lines)
        assert all(b.reason for b in bad)
        clickhouse.insert_records(store, clickhouse.TABLE_OF[record_type], good)  # raises if one does not fit
        accepted += len(good)
    assert accepted > 0, "the fuzzer should leave some records valid"
