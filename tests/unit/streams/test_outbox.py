# SPDX-License-Identifier: Apache-2.0
"""Refused sends are sent again (streams/outbox.py). The topic here is a
stand-in whose broker answers are scripted; the real broker's refusal after
a restart is exercised in tests/integration/test_broker_faults.py."""

import asyncio

from jitterscope.streams import outbox
from jitterscope.streams.outbox import Outbox


class ScriptedTopic:
    """Answers each send with the next scripted outcome: an exception
    refuses it, None accepts it."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.sent: list[tuple[bytes, bytes]] = []

    def get_topic_name(self) -> str:
        return "jitterscope.test"

    def as_future_message(self, key: bytes, value: bytes) -> asyncio.Future:
        self.sent.append((key, value))
        return asyncio.get_running_loop().create_future()

    async def publish_message(self, message: asyncio.Future) -> None:
        answer = self.answers.pop(0) if self.answers else None
        loop = asyncio.get_running_loop()
        if answer is None:
            loop.call_soon(message.set_result, "ok")
        else:
            loop.call_soon(message.set_exception, answer)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


async def settle(box: Outbox, topic: ScriptedTopic, sends: int) -> None:
    while len(topic.sent) < sends or box.pending:
        await asyncio.sleep(0.01)


def test_a_refused_message_is_sent_again_until_accepted(monkeypatch):
    monkeypatch.setattr(outbox, "FIRST_PAUSE_S", 0.01)
    before = outbox.RESENT.labels("jitterscope.test")._value.get()

    async def scenario():
        box, topic = Outbox(give_up_s=60), ScriptedTopic(RuntimeError("UnknownError"), RuntimeError("again"), None)
        await box.send(topic, b"host-a", b"alert")
        await settle(box, topic, 3)
        return topic.sent

    assert run(scenario()) == [(b"host-a", b"alert")] * 3
    assert outbox.RESENT.labels("jitterscope.test")._value.get() - before == 2


def test_an_accepted_message_is_sent_once():
    async def scenario():
        box, topic = Outbox(), ScriptedTopic(None)
        await box.send(topic, b"k", b"v")
        await settle(box, topic, 1)
        await asyncio.sleep(0.05)
        return topic.sent

    assert run(scenario()) == [(b"k", b"v")]


def test_past_the_window_it_is_given_up_and_counted(monkeypatch):
    monkeypatch.setattr(outbox, "FIRST_PAUSE_S", 0.01)
    given_up = outbox.GIVEN_UP.labels("jitterscope.test")._value.get()

    async def scenario():
        box, topic = Outbox(give_up_s=0.2), ScriptedTopic(*[RuntimeError("down")] * 1000)
        await box.send(topic, b"k", b"v")
        await settle(box, topic, 2)
        return len(topic.sent)

    tries = run(scenario())
    assert 2 <= tries < 20  # pauses double from 10 ms: a handful of tries fit in 0.2 s
    assert outbox.GIVEN_UP.labels("jitterscope.test")._value.get() - given_up == 1


def test_a_send_the_producer_refuses_at_once_is_retried_not_raised(monkeypatch):
    """aiokafka raises from send itself when it has no metadata: the caller
    (which stores what it publishes next) must not see it."""
    monkeypatch.setattr(outbox, "FIRST_PAUSE_S", 0.01)

    class RefusesFirstHandOver(ScriptedTopic):
        async def publish_message(self, message):
            if len(self.sent) == 1:
                raise RuntimeError("KafkaTimeoutError: no metadata")
            await super().publish_message(message)

    async def scenario():
        box, topic = Outbox(give_up_s=60), RefusesFirstHandOver()
        await box.send(topic, b"k", b"v")  # does not raise
        await settle(box, topic, 2)
        return topic.sent

    assert run(scenario()) == [(b"k", b"v")] * 2


def test_retries_are_bounded_in_memory(monkeypatch):
    """A broker refusing everything for minutes must not grow the worker
    without bound: past max_pending_bytes a refused message is given up."""
    monkeypatch.setattr(outbox, "FIRST_PAUSE_S", 30)  # nothing is retried during the test
    given_up = outbox.GIVEN_UP.labels("jitterscope.test")._value.get()

    async def scenario():
        box, topic = Outbox(give_up_s=600, max_pending_bytes=1000), ScriptedTopic(*[RuntimeError("down")] * 10)
        for _ in range(10):
            await box.send(topic, b"k", b"v" * 199)  # 200 bytes each: 5 fit
        while len(topic.sent) < 10 or box.pending + outbox.GIVEN_UP.labels(
                "jitterscope.test")._value.get() - given_up < 10:
            await asyncio.sleep(0.01)
        pending = box.pending
        for retry in list(box._retries):
            retry.cancel()
        return pending

    assert run(scenario()) == 5
    assert outbox.GIVEN_UP.labels("jitterscope.test")._value.get() - given_up == 5
