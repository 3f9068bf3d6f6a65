# SPDX-License-Identifier: Apache-2.0
"""The ``serving`` signal: the serving engine's own metrics, scraped from
its Prometheus endpoint (``serving_metrics_urls``, e.g. vLLM's
``http://127.0.0.1:8000/metrics``) every ``serving_metrics_interval_s``, as
one ServingMetrics record per model and interval (collector/serving_metrics.py).
No URL configured: no thread, nothing read.

The scrape is HTTP, so it happens on the sampler's own thread only (never
on the agent's loop, which a slow endpoint would stall): ``periodic`` here
publishes what was read and takes nothing itself. A scrape is bounded (2 s,
4 MiB); an endpoint that does not answer, or answers something that is not
Prometheus text, is skipped for that interval and counted.
"""

from __future__ import annotations

import urllib.request

from prometheus_client import Counter

from jitterscope.collector import serving_metrics
from jitterscope.collector.probes.interface import ProbeContext
from jitterscope.collector.probes.sampled import SampledSignal
from jitterscope.common import outbound
from jitterscope.schemas import events

SCRAPE_TIMEOUT_S = 2.0
SCRAPE_MAX_BYTES = 4 << 20  # vLLM's page is ~100 KiB; a bigger answer is not a metrics page
FAILED = Counter("jitterscope_collector_serving_scrapes_failed_total",
                 "serving-engine metrics endpoints that did not answer, or not with Prometheus text", ["why"])


def scrape(opener: urllib.request.OpenerDirector, url: str) -> dict[str, serving_metrics.Scrape] | None:
    """One endpoint's models as read now (serving_metrics.parse); None, counted
    in FAILED, where it did not answer or not with Prometheus text."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    try:
        with opener.open(request, timeout=SCRAPE_TIMEOUT_S) as response:
            body = response.read(SCRAPE_MAX_BYTES + 1)
    except (OSError, ValueError):  # refused, timed out, a redirect, a bad URL
        FAILED.labels("unreachable").inc()
        return None
    try:
        if len(body) > SCRAPE_MAX_BYTES:
            raise ValueError("too large")
        return serving_metrics.parse(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        FAILED.labels("not_prometheus").inc()
        return None


class ServingSignal(SampledSignal):
    """ServingMetrics per endpoint and model every ``serving_metrics_interval_s``."""

    name = "serving"
    publishes = (events.ServingMetrics,)

    def open(self, context: ProbeContext) -> None:
        self.ctx = context
        self.urls = list(context.settings.serving_metrics_urls)
        self._opener = outbound.opener()  # refuses redirects; loopback reached directly
        self._last: dict[tuple[str, str], serving_metrics.Scrape] = {}  # (url, model) -> the previous scrape
        if self.urls:
            self.start_clock(context, context.settings.serving_metrics_interval_s)

    def read(self) -> list[dict]:
        """Each endpoint's models, as interval fields against their previous scrape."""
        out = []
        for url in self.urls:
            models = scrape(self._opener, url)
            for model, now in (models or {}).items():
                out.append({"endpoint": url, "model": model,
                            **serving_metrics.interval(self._last.get((url, model)), now)})
                self._last[(url, model)] = now
        return out

    def records(self, reading: list[dict], interval_ns: int, now_ns: int) -> list[events.Record]:
        return [self.ctx.record(events.ServingMetrics, now_ns, interval_ns=interval_ns, **fields) for fields in reading]

    def periodic(self, interval_ns: int, now_ns: int) -> list[events.Record]:
        """What the sampler read; never a scrape here, on the agent's loop."""
        return self._drain() if hasattr(self, "_readings") else []
