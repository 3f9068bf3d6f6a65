# SPDX-License-Identifier: Apache-2.0
"""A request's answer per phase (issue 37, item 2): vLLM's span carries how
long the request sat in the queue, in the model's prefill and in its decode
(``gen_ai.latency.*``, RequestSpan.queue_ns/prefill_ns/decode_ns/ttft_ns).
Which cause took the queue time and which the decode time is what a vLLM
operator asks ("TTFT 900 ms: 700 ms in queue while EngineCore waited for the
GIL"), so each phase's window is attributed on its own, with the same
charges and weighing as the whole request (streams/attribution.py,
streams/causes.py), the phase's length standing for the excess: its top cause
is whatever took the most of that phase.

The phases are placed on the request's timeline around its first token
(``ttft_ns`` after the start; without it, the request ends with its last
token and the first comes ``decode_ns`` before the end): prefill ends at the
first token, the queue before it, decode after it. vLLM's phases are the
engine's; the rest of the request is the API server's, and is a phase too:
``front`` from the span's start until it was queued (receiving, tokenizing,
and waiting for the front end's GIL) and ``output`` after its last token
(detokenizing, answering). Each window is clipped to the span.
"""

from __future__ import annotations

from typing import Callable

from jitterscope.schemas.events import PhasePart, RequestSpan
from jitterscope.streams.causes import Charges, weigh
from jitterscope.streams.thread_budget import ThreadBudget
from jitterscope.streams.token_slo import TokenObjectives

#: (charges, the carrying thread's budget, union of the group's waits) over a window (lo, hi)
ChargeWindow = Callable[[int, int], tuple[Charges, ThreadBudget, int]]
#: whom a cause names, from a window's charges and budget
NameCulprit = Callable[[str, Charges, ThreadBudget], str]


def windows(span: RequestSpan) -> list[tuple[str, int, int]]:
    """(phase, start, end) of each phase the span carries, in order; [] for a span without phases."""
    if not (span.queue_ns or span.prefill_ns or span.decode_ns):
        return []
    start, end = span.start_ns, span.end_ns
    if span.ttft_ns:  # the first token's time is known: decode follows it, what is left after is output
        first_token = start + span.ttft_ns
        last_token = first_token + span.decode_ns
    else:  # it ends with its last token
        first_token, last_token = end - span.decode_ns, end
    queued = first_token - span.prefill_ns - span.queue_ns
    bounds = [("front", start, queued), ("queue", queued, queued + span.queue_ns),
              ("prefill", first_token - span.prefill_ns, first_token), ("decode", first_token, last_token),
              ("output", last_token, end)]
    clipped = [(name, max(start, lo), min(end, hi)) for name, lo, hi in bounds]
    return [(name, lo, hi) for name, lo, hi in clipped if hi > lo]


def windows_wanted(span: RequestSpan, slo_of: Callable[[RequestSpan], int],
                   tokens: TokenObjectives) -> list[tuple[int, int]]:
    """The phase windows of a span that will get per-phase answers: one
    over its SLO (``slo_of``: asked only of a span with phases) or its
    model's token objectives (a request's cause is only known once
    attributed; a quick one over its SLO still costs nothing but its
    windows). Attribution answers them with its batch's index."""
    found = windows(span)
    if not found or not (tokens.broken(span.model, span.ttft_ns, inter_token_ns(span))
                         or (slo := slo_of(span)) and span.end_ns - span.start_ns > slo):
        return []
    return [(lo, hi) for _, lo, hi in found]


def phase_parts(span: RequestSpan, charge: ChargeWindow, culprit: NameCulprit) -> list[PhasePart]:
    """Each phase's length, its top cause (the one that took the most of it;
    "" where none took a twentieth), that cause's ns and culprit, and the
    carrying thread's run-queue and stall time in it."""
    parts = []
    for name, lo, hi in windows(span):
        charged, budget, waited = charge(lo, hi)
        _cause, _explained, causes = weigh(hi - lo, 0, waited, charged, budget)
        top, share = causes[0] if causes else ("", 0.0)
        parts.append(PhasePart(
            phase=name, ns=hi - lo, cause=top, cause_ns=int(share * (hi - lo)),
            culprit=culprit(top, charged, budget) if top else "", runq_ns=budget.runq_ns,
            gil_ns=budget.blocked.get("gil", 0), memory_ns=budget.blocked.get("memory", 0),
            io_ns=budget.blocked.get("io", 0)))
    return parts


def inter_token_ns(span: RequestSpan) -> int:
    """Its mean time between output tokens: decode over the tokens after the first (0: not known)."""
    return span.decode_ns // (span.output_tokens - 1) if span.output_tokens > 1 else 0
