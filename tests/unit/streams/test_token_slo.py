# SPDX-License-Identifier: Apache-2.0
"""Per-token objectives (streams/token_slo.py): a model's TTFT and
inter-token objectives, by exact name or pattern; a request over either is
marked and raises request_slo, whose line says what its user waited for."""

from __future__ import annotations

from msgspec.structs import replace

from jitterscope.schemas.events import PhasePart
from jitterscope.streams.phases import inter_token_ns
from jitterscope.streams.rules.requests import request_slo
from jitterscope.streams.token_slo import TokenObjectives, objective_ns
from tests.unit.streams.rules.test_rules import MS, NOW, attribution
from tests.unit.streams.test_phases import phased


def test_the_exact_model_name_wins_then_the_first_pattern_then_none():
    objectives = {"llama-*": 300.0, "llama-70b": 900.0, "*": 2000.0}
    assert objective_ns(objectives, "llama-70b") == 900 * MS
    assert objective_ns(objectives, "llama-8b") == 300 * MS
    assert objective_ns(objectives, "qwen") == 2000 * MS
    assert objective_ns({"llama-*": 300.0}, "qwen") == 0


def test_a_request_over_its_models_objectives_is_marked_and_raises_request_slo():
    objectives = TokenObjectives({"llama-*": 500.0}, {"llama-*": 50.0})
    assert objectives.broken("llama-8b", 400 * MS, 30 * MS) == []
    assert request_slo(attribution(model="llama-8b", slo_breached=False), "vllm", [0], [0, 1], NOW) is None
    assert objectives.broken("llama-8b", 900 * MS, 80 * MS) == ["ttft", "itl"]
    assert objectives.broken("qwen", 9000 * MS, 900 * MS) == []  # another model, no objective: nothing to break
    assert TokenObjectives({}, {}).broken("llama-8b", 900 * MS, 80 * MS) == []  # none configured
    slow = attribution(model="llama-8b", ttft_ns=900 * MS, itl_ns=80 * MS, slo_breached=False,
                       token_slo_breached=["ttft", "itl"],
                       phases=[PhasePart(phase="queue", ns=700 * MS, cause="gil_contention", cause_ns=650 * MS,
                                         culprit="gil-hog[123]")])
    alert = request_slo(slow, "vllm", [0], [0, 1], NOW)
    assert alert.summary.startswith("request req-42 (llm_request, model llama-8b): time to first token 900 ms, "
                                    "time between tokens 80 ms over its objective; took 400 ms"), alert.summary
    assert "by phase: queue 700 ms (650 ms gil_contention, gil-hog[123])" in alert.summary
    assert alert.severity == "warning"


def test_the_attributor_marks_a_request_over_its_ttft_and_gives_it_phases():
    from jitterscope.streams.attribution import Attributor
    from tests.unit.streams.test_attribution import GRACE, baseline, due_after

    a = Attributor(grace_ns=GRACE, tokens=TokenObjectives({"llama-*": 30.0}, {}))
    baseline(a)
    a.add_request(replace(phased(0, 50, queue=10, prefill=10, decode=20, ttft=40), model="llama-8b"))
    a.add_request(replace(phased(0, 50, queue=10, prefill=10, decode=20, ttft=20), model="llama-8b"))
    late, early = due_after(a, 50)
    assert (late.token_slo_breached, late.ttft_ns) == (["ttft"], 40 * MS) and late.phases
    # under its objectives and its SLO (none trusted yet): no per-phase answer, which costs several attributions
    assert early.token_slo_breached == [] and early.phases == [] and not early.slo_breached


def test_inter_token_latency_is_decode_over_the_tokens_after_the_first():
    span = phased(0, 500, queue=10, prefill=40, decode=450)
    assert inter_token_ns(replace(span, output_tokens=10)) == 50 * MS
    assert inter_token_ns(replace(span, output_tokens=1)) == 0 and inter_token_ns(span) == 0
