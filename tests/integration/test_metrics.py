# SPDX-License-Identifier: Apache-2.0
"""What a Prometheus-only shop scrapes, from a real collector (BPF on this
kernel) and a real streams worker whose web port is bound beyond loopback:
running totals as Counters, build info on both, consumer lag per partition,
the run-queue wait and GPU driver call latency as histograms with a capped
process-name label, and /query still behind its token on the open port."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Producer

from jitterscope.broker import free_port
from jitterscope.common.settings import load
from jitterscope.schemas import batches, events, topics
from jitterscope.streams.worker_state import state_file
from jitterscope.workload import VICTIM_COMM, starvation
from tests.conftest import wait_until

pytestmark = [pytest.mark.bpf, pytest.mark.integration]

COLLECTOR_PORT = free_port()
COMMS_MAX = 3
DUMMY_LINK, DUMMY_ADDR = "jsmetrics0", "198.51.100.77"


def outside_address():
    """An address of this host other than loopback: the first global IPv4
    one, or one on a dummy link made for the test (a bare CI box)."""
    found = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True)
    match = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", found.stdout)
    if match:
        return match.group(1), False
    subprocess.run(["ip", "link", "add", DUMMY_LINK, "type", "dummy"], check=True)
    subprocess.run(["ip", "addr", "add", f"{DUMMY_ADDR}/32", "dev", DUMMY_LINK], check=True)
    subprocess.run(["ip", "link", "set", DUMMY_LINK, "up"], check=True)
    return DUMMY_ADDR, True


@pytest.fixture(scope="module")
def scraped(stack):
    address, made = outside_address()
    worker = stack.start_worker_with(JITTERSCOPE_STREAMS_WEB_BIND="0.0.0.0",
                                     JITTERSCOPE_METRICS_COMMS_MAX=str(COMMS_MAX))
    collector = stack.start_collector(
        JITTERSCOPE_TARGET_COMMS=f'["{VICTIM_COMM}*"]', JITTERSCOPE_TARGET_RESCAN_S="0.2",
        JITTERSCOPE_HISTOGRAM_INTERVAL_S="1", JITTERSCOPE_COLLECTOR_METRICS_PORT=str(COLLECTOR_PORT))
    yield stack, worker, collector, address
    collector.stop()
    worker.stop()
    if made:
        subprocess.run(["ip", "link", "del", DUMMY_LINK], check=False)


def scrape(address: str, port: int) -> str:
    return urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=10).read().decode()


def samples(text: str, name: str) -> dict[str, float]:
    """{label text: value} of one metric's samples."""
    out = {}
    for line in text.splitlines():
        m = re.match(rf"{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


def types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M))


def histogram(comm: str, probe: str, slots: list[int], counts: list[int], seq: int) -> events.LatencyHistogram:
    return events.LatencyHistogram(host="metrics-test", boot_id="b", seq=seq, ts_ns=1, probe=probe,
                                   interval_ns=1_000_000_000, pid=100 + seq, comm=comm, slots=slots, counts=counts)


def test_running_totals_are_counters_and_both_processes_say_their_build(scraped):
    stack, worker, collector, address = scraped
    for text in (scrape("127.0.0.1", COLLECTOR_PORT), scrape(address, stack.web_port)):
        [(labels, value)] = samples(text, "jitterscope_build_info").items()
        assert value == 1 and 'version="' in labels and 'python="3.' in labels
    worker_types = types(scrape(address, stack.web_port))
    assert worker_types["jitterscope_streams_late_evidence_total"] == "counter"
    collector_types = types(scrape("127.0.0.1", COLLECTOR_PORT))
    for name in ("records_sent", "delivery_errors", "ringbuf_drops"):
        assert collector_types[f"jitterscope_collector_{name}_total"] == "counter", name
    # a Gauge named like a running total would read as one; every family that counts is a counter
    gauges = {n for n, t in {**worker_types, **collector_types}.items() if t == "gauge"}
    assert not [n for n in gauges if re.search(r"(sent|errors|drops|evidence)$", n)], gauges


def test_run_queue_waits_of_a_starved_process_reach_the_histogram(scraped):
    stack, worker, collector, address = scraped
    with starvation(seconds=4, hogs=3, delay=0.5):
        pass

    def victim_buckets():
        got = {k: v for k, v in samples(scrape(address, stack.web_port), "jitterscope_runq_wait_seconds_bucket").items()
               if f'comm="{VICTIM_COMM}"' in k}
        return got if got.get(f'{{comm="{VICTIM_COMM}",le="+Inf"}}', 0) >= 10 else None

    try:
        buckets = wait_until(victim_buckets, 60, "the victim's waits on the worker's /metrics", worker)
    except AssertionError:
        text = scrape(address, stack.web_port)
        raise AssertionError(f"{samples(text, 'jitterscope_runq_wait_seconds_count')}\n{collector.text()[-3000:]}")
    bounds = sorted(float(re.search(r'le="([^"]+)"', k).group(1)) for k in buckets if "+Inf" not in k)
    assert bounds[0] == 2e-6 and all(b == 2 * a for a, b in zip(bounds, bounds[1:])), "log2 buckets in seconds"
    cumulative = [buckets[f'{{comm="{VICTIM_COMM}",le="{b!r}"}}'] for b in bounds]
    assert cumulative == sorted(cumulative) and cumulative[-1] <= buckets[f'{{comm="{VICTIM_COMM}",le="+Inf"}}']
    # a hog shared its CPU: some waits were milliseconds long
    assert buckets[f'{{comm="{VICTIM_COMM}",le="+Inf"}}'] > buckets[f'{{comm="{VICTIM_COMM}",le="0.001024"}}']


def test_process_names_are_capped_and_gpu_latency_is_exposed(scraped):
    stack, worker, collector, address = scraped
    producer = Producer({"bootstrap.servers": stack.broker.bootstrap_servers})
    records = [histogram(f"proc{i}", "runq", [3, 10], [5, 1], i) for i in range(6)]
    records.append(histogram("cudaworker", "gpu_ioctl", [16], [7], 50))  # 65-131 ms
    for record in records:
        topic = topics.HISTOGRAMS
        producer.produce(topic, batches.encode_batch([record]), key=b"metrics-test")
    assert producer.flush(10) == 0

    def done():
        text = scrape(address, stack.web_port)
        gpu = samples(text, "jitterscope_gpu_ioctl_latency_seconds_bucket")
        runq = samples(text, "jitterscope_runq_wait_seconds_count")
        produced = sum(v for k, v in runq.items() if "proc" in k or "other" in k)
        return (text, gpu, runq) if gpu and produced >= 36 else None

    text, gpu, runq = wait_until(done, 60, "the produced histograms on /metrics", worker)
    comms = {re.search(r'comm="([^"]*)"', k).group(1) for k in runq}
    assert len(comms) == COMMS_MAX + 1 and "other" in comms, comms
    # the cap moves names to "other", it loses no waits
    assert sum(runq.values()) >= 36
    assert gpu['{comm="cudaworker",le="0.065536"}'] == 0 and gpu['{comm="cudaworker",le="0.131072"}'] == 7


def test_consumer_lag_per_partition(scraped):
    stack, worker, collector, address = scraped
    text = scrape(address, stack.web_port)
    lag = samples(text, "jitterscope_streams_consumer_lag")
    position = samples(text, "jitterscope_streams_consumer_position")
    read = [k for k in position if 'topic="jitterscope.histograms"' in k]
    assert read and any(position[k] > 0 for k in read), "the worker read the histograms the test and collector sent"
    assert all(v >= 0 for v in lag.values()) and set(lag) <= set(position)
    assert "lower bound" in text and "Tansu" in text, "the help text says what the lag can and cannot tell"


def test_query_on_an_open_port_still_wants_the_token(scraped):
    stack, worker, collector, address = scraped
    token = json.loads(state_file(load(data_dir=stack.data_dir).data_dir).read_text())["token"]

    def post(auth: str | None) -> int:
        request = urllib.request.Request(f"http://{address}:{stack.web_port}/query", method="POST",
                                         data=json.dumps({"sql": "SELECT 1"}).encode(),
                                         headers={"Authorization": auth} if auth else {})
        try:
            return urllib.request.urlopen(request, timeout=30).status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert post(None) == 401
    assert post("Bearer guessed") == 403
    assert post(f"Bearer {token}") == 200
