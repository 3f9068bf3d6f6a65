# SPDX-License-Identifier: Apache-2.0
"""Per-token objectives (streams/token_slo.py): a model's TTFT and
inter-token objectives, by exact name or pattern; a request over either is
marked and raises request_slo, whose line says what its user waited for."""

from __future__ import annotations

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
    quick = attribution(model="llama-8b", ttft_ns=400 * MS, itl_ns=30 * MS, slo_breached=False)
    assert objectives.judge(quick) is quick and request_slo(quick, "vllm", [0], [0, 1], NOW) is None
    slow = objectives.judge(attribution(model="llama-8b", ttft_ns=900 * MS, itl_ns=80 * MS, slo_breached=False,
                                        phases=[PhasePart(phase="queue", ns=700 * MS, cause="gil_contention",
                                                          cause_ns=650 * MS, culprit="gil-hog[123]")]))
    assert slow.token_slo_breached == ["ttft", "itl"]
    alert = request_slo(slow, "vllm", [0], [0, 1], NOW)
    assert alert.summary.startswith("request req-42 (llm_request, model llama-8b): time to first token 900 ms, "
                                    "time between tokens 80 ms over its objective; took 400 ms"), alert.summary
    assert "by phase: queue 700 ms (650 ms gil_contention, gil-hog[123])" in alert.summary
    assert alert.severity == "warning"
    # another model, no objective: nothing to break
    other = attribution(model="qwen", ttft_ns=9000 * MS, slo_breached=False)
    assert objectives.judge(other).token_slo_breached == []
    assert TokenObjectives({}, {}).judge(slow) is slow  # none configured: untouched


def test_inter_token_latency_is_decode_over_the_tokens_after_the_first():
    from msgspec.structs import replace

    span = phased(0, 500, queue=10, prefill=40, decode=450)
    assert inter_token_ns(replace(span, output_tokens=10)) == 50 * MS
    assert inter_token_ns(replace(span, output_tokens=1)) == 0 and inter_token_ns(span) == 0
