# SPDX-License-Identifier: Apache-2.0
"""The serving engine's own metrics (collector/serving_metrics.py and the
``serving`` probe): vLLM's /metrics text read with prometheus_client's
parser, each histogram's P50/P99 over an interval from its buckets' change,
and a probe that scrapes a real local HTTP endpoint on its own thread."""

from __future__ import annotations

import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jitterscope.collector import serving_metrics
from jitterscope.collector.probes.serving import ServingSignal

BOUNDS = (0.01, 0.05, 0.1, 0.5, 1.0)


def histogram(name: str, model: str, counts: tuple[int, ...]) -> str:
    """A vLLM-style histogram: cumulative counts per bound, then +Inf."""
    lines = [f"# TYPE {name} histogram"]
    for bound, count in zip((*BOUNDS, math.inf), counts):
        le = "+Inf" if math.isinf(bound) else str(bound)
        lines.append(f'{name}_bucket{{engine="0",le="{le}",model_name="{model}"}} {float(count)}')
    lines += [f'{name}_count{{engine="0",model_name="{model}"}} {float(counts[-1])}',
              f'{name}_sum{{engine="0",model_name="{model}"}} 1.0']
    return "\n".join(lines)


def page(ttft: tuple[int, ...], itl: tuple[int, ...], running: float = 2, waiting: float = 5, model: str = "tiny") -> str:
    return "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge", f'vllm:num_requests_running{{engine="0",model_name="{model}"}} {running}',
        "# TYPE vllm:num_requests_waiting gauge", f'vllm:num_requests_waiting{{engine="0",model_name="{model}"}} {waiting}',
        "# TYPE vllm:kv_cache_usage_perc gauge", f'vllm:kv_cache_usage_perc{{engine="0",model_name="{model}"}} 0.25',
        "# TYPE vllm:prompt_tokens counter", f'vllm:prompt_tokens_total{{engine="0",model_name="{model}"}} 99.0',
        histogram("vllm:time_to_first_token_seconds", model, ttft),
        histogram("vllm:inter_token_latency_seconds", model, itl), ""])


def test_a_vllm_page_gives_its_gauges_and_buckets_per_model():
    scraped = serving_metrics.parse(page((0, 4, 8, 10, 10, 10), (50, 90, 100, 100, 100, 100)))
    (model, scrape), = scraped.items()
    assert model == "tiny"
    assert scrape.gauges == {"requests_running": 2.0, "requests_waiting": 5.0, "kv_cache_usage": 0.25}
    assert scrape.buckets["ttft"] == {0.01: 0, 0.05: 4, 0.1: 8, 0.5: 10, 1.0: 10, math.inf: 10}


def test_the_quantiles_are_of_what_finished_in_the_interval():
    before = serving_metrics.parse(page((0, 4, 8, 10, 10, 10), (50, 90, 100, 100, 100, 100)))["tiny"]
    # 10 more first tokens, all between 0.5 and 1 s: the interval's P50 and P99 are in that bucket
    now = serving_metrics.parse(page((0, 4, 8, 10, 20, 20), (50, 90, 100, 100, 100, 200), waiting=7))["tiny"]
    fields = serving_metrics.interval(before, now)
    assert fields["ttft_count"] == 10 and fields["requests_waiting"] == 7.0
    assert fields["ttft_p50_ns"] == 750_000_000  # halfway through the 0.5-1 s bucket, as histogram_quantile
    assert fields["ttft_p99_ns"] == pytest.approx(995_000_000, abs=1)
    assert fields["itl_count"] == 100 and fields["itl_p99_ns"] == 1_000_000_000  # in +Inf: the largest finite bound
    # the first scrape: everything since the engine started
    assert serving_metrics.interval(None, before)["ttft_count"] == 10


def test_a_restarted_engine_counts_from_zero_and_nothing_new_is_zero():
    before = serving_metrics.parse(page((0, 4, 8, 10, 10, 10), (0, 0, 0, 0, 0, 0)))["tiny"]
    restarted = serving_metrics.parse(page((0, 1, 2, 2, 2, 2), (0, 0, 0, 0, 0, 0)))["tiny"]
    fields = serving_metrics.interval(before, restarted)
    assert fields["ttft_count"] == 2 and 0 < fields["ttft_p99_ns"] <= 100_000_000
    assert serving_metrics.interval(before, before)["ttft_p99_ns"] == 0


def test_text_that_is_not_prometheus_is_refused():
    with pytest.raises(ValueError):
        serving_metrics.parse("<html>not metrics{</html>\n")


class _Endpoint:
    """A real local HTTP endpoint serving ``self.text`` at /metrics."""

    def __init__(self):
        self.text = ""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = outer.text.encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_the_probe_scrapes_each_url_and_skips_what_does_not_answer():
    from types import SimpleNamespace

    endpoint = _Endpoint()
    try:
        probe = ServingSignal()
        settings = SimpleNamespace(serving_metrics_urls=[endpoint.url, "http://127.0.0.1:9/metrics"],
                                   serving_metrics_interval_s=3600)
        probe.open(SimpleNamespace(settings=settings))
        endpoint.text = page((0, 4, 8, 10, 10, 10), (0, 0, 0, 0, 0, 0))
        first = probe.read()
        endpoint.text = page((0, 4, 8, 10, 20, 20), (0, 0, 0, 0, 0, 0))
        (second,) = probe.read()
        assert [r["endpoint"] for r in first] == [endpoint.url]  # the dead one is skipped, and counted
        assert (second["model"], second["ttft_count"], second["ttft_p50_ns"]) == ("tiny", 10, 750_000_000)
        endpoint.text = "not { metrics"
        assert probe.read() == []
        probe.close()
    finally:
        endpoint.server.shutdown()


def test_doctor_says_which_endpoints_answer_and_how_to_fix_one_that_does_not(tmp_path):
    from jitterscope.doctor import check_serving
    from jitterscope.common.settings import load

    endpoint = _Endpoint()
    try:
        endpoint.text = page((0, 4, 8, 10, 10, 10), (0, 0, 0, 0, 0, 0))
        good, bad = check_serving(load(data_dir=tmp_path, serving_metrics_urls=[endpoint.url,
                                                                                "http://127.0.0.1:9/metrics"]))
        assert good.ok and "model(s) tiny" in good.detail
        assert not bad.ok and "serving_metrics_urls" in bad.fix
        assert check_serving(load(data_dir=tmp_path)) == []  # none configured: nothing to check
    finally:
        endpoint.server.shutdown()
