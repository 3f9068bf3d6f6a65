# SPDX-License-Identifier: Apache-2.0
"""The worker's fetch wait (streams/kafka_patches.py): the embedded broker
holds every fetch its full wait, so after a fetch that brought records the
next asks for the short busy wait, and after an empty one the idle wait
again. Runs aiokafka's real Fetcher method through the patch with the
broker's answer stood in: the policy is pure, the network is not tested here."""

from __future__ import annotations

import asyncio

from aiokafka.consumer.fetcher import Fetcher

from jitterscope.streams import kafka_patches


def stand_in(monkeypatch, broker_answer) -> None:
    """The broker's answer in place of aiokafka's request, as the method the
    patch wraps; both attributes are restored after the test."""
    monkeypatch.setattr(Fetcher, "_proc_fetch_request", broker_answer)
    monkeypatch.setattr(Fetcher, "_jitterscope_original_fetch", broker_answer, raising=False)


def test_the_fetch_wait_is_short_while_records_flow_and_long_when_idle(monkeypatch):
    answers = iter([True, True, False, True, False, False])

    async def broker_answer(self, assignment, node_id, request):
        return next(answers)

    stand_in(monkeypatch, broker_answer)
    kafka_patches._shorter_wait_while_busy(idle_ms=100, busy_ms=20)
    fetcher = Fetcher.__new__(Fetcher)  # only the wait attribute is used
    fetcher._fetch_max_wait_ms = 100
    waits = []
    for _ in range(6):
        asyncio.run(fetcher._proc_fetch_request(None, 0, None))
        waits.append(fetcher._fetch_max_wait_ms)
    assert waits == [20, 20, 100, 20, 100, 100]


def test_a_busy_wait_above_the_idle_one_is_never_longer_than_idle(monkeypatch):
    async def broker_answer(self, assignment, node_id, request):
        return True

    stand_in(monkeypatch, broker_answer)
    kafka_patches._shorter_wait_while_busy(idle_ms=50, busy_ms=200)
    fetcher = Fetcher.__new__(Fetcher)
    asyncio.run(fetcher._proc_fetch_request(None, 0, None))
    assert fetcher._fetch_max_wait_ms == 50
