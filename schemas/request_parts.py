# SPDX-License-Identifier: Apache-2.0
"""The parts of a request's attribution (schemas/events.py's
RequestAttribution): its suspects, its stacked causes, its wait-for chain
and its phases. Nested structs, never records of their own; events.py
re-exports them."""

from __future__ import annotations

import msgspec

from jitterscope.schemas.ranges import U32, U64


class Suspect(msgspec.Struct, frozen=True, gc=False):
    pid: U32
    comm: str
    wait_ns: U64  # run-queue wait of the request's threads while this task held the CPU


class CauseShare(msgspec.Struct, frozen=True, gc=False):
    cause: str
    share: float  # of the request's excess, 0..1


class ChainHop(msgspec.Struct, frozen=True, gc=False):
    """One hop of a wait-for chain (streams/wait_chain.py): the thread that
    woke the one before it, and what kept it from doing so sooner."""

    tid: U32
    comm: str
    waited_ns: U64  # how long the thread before it slept until this one woke it
    kind: str  # what took most of this thread's time meanwhile: runq, gil, memory, io, sleep (the next hop), cpu
    ns: U64
    culprit: str  # the neighbour that held its CPU, the GIL's holder, the device, the next hop's waker


class PhasePart(msgspec.Struct, frozen=True, gc=False):
    """One phase of a request (front, queue, prefill, decode, output: the
    engine's phases as its span gave them, and the API server's before and
    after; streams/phases.py): how long it took, the cause that took the most of it
    and how much ("" where none took a twentieth), that cause's culprit, and
    the carrying thread's run-queue and stall time within it."""

    phase: str
    ns: U64
    cause: str
    cause_ns: U64
    culprit: str
    runq_ns: U64 = 0
    gil_ns: U64 = 0
    memory_ns: U64 = 0
    io_ns: U64 = 0
