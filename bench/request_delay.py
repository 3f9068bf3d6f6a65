# SPDX-License-Identifier: Apache-2.0
"""`bench/run.py request-alert-delay`: how long after a request ends its
``request_slo`` alert is raised (``raised − end``), under `jitterscope up`
(embedded broker, the real collector, its probes and OTLP receiver, the
stages), with the README's first-hour load: the inference stand-in pinned to
the last CPU, where the demo's starvation storm (a victim and three hogs)
runs all along. ``request_slo_ms`` is 1, so every request raises one: the
delay of each is measured, not only of the few a baseline would call slow.

The baseline arm is this tree with streams/attribution.py as at BEFORE:
a request waited for its whole grace period (``attribution_grace_s``, 2 s)
whatever evidence had come; now it is attributed as soon as every kind of
evidence its host sends has come past its end (streams/evidence_clock.py),
the grace period only where that does not happen. Runs alternate the two
arms, the order flipped each round. It also reports the attribution stage's
late evidence (kernel evidence that came after a request it overlapped was
attributed): the cost of attributing sooner, if any.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from alert_delay import _metrics, _pct, _summed, baseline_tree, quantiles_ms, running_up  # noqa: E402  (bench/ is on sys.path)

#: attribution before the evidence clock
BEFORE = "3c483c7"
BASELINE_FILES = ["streams/attribution.py"]
STANDIN = Path(__file__).resolve().parents[1] / "examples/inference_standin.py"
SECONDS = 40.0
REQUESTS = 400  # ~30 s on the storm's CPU (10 ms of CPU each, shared four ways, and 15 ms apart)


def requests_under_up(tree: Path | None, seconds: float = SECONDS) -> dict:
    """One `up` run with the stand-in's requests and the storm: every
    request alert's delay (s), the attribution stage's late evidence and
    attributions, and up's stop summary."""
    from jitterscope.broker import free_port
    from jitterscope.workload import last_cpu, starvation

    otlp, attribute = free_port(), free_port()
    with running_up(tree, {"JITTERSCOPE_ATTRIBUTE_WEB_PORT": str(attribute), "JITTERSCOPE_OTLP_PORT": str(otlp),
                           "JITTERSCOPE_REQUEST_SLO_MS": "1"}) as run:
        with starvation(seconds=seconds, hogs=3, delay=0.0):
            standin = subprocess.run(
                [sys.executable, str(STANDIN), "--endpoint", f"http://127.0.0.1:{otlp}/v1/traces",
                 "--requests", str(REQUESTS), "--cpu-ms", "10", "--gap-ms", "15",
                 "--pin-cpu", str(last_cpu()), "--no-times"], capture_output=True, text=True, timeout=600)
        assert standin.returncode == 0, standin.stdout + standin.stderr
        time.sleep(5)  # the last requests' grace period, then their alerts
        text = _metrics(attribute)
        run.stop()
        # each request's first raise: an alert group's re-announcements (still firing) are rows of their own
        delays = sorted(r[0] for r in run.query(
            "SELECT (min(toUnixTimestamp64Nano(raised)) - any(toUnixTimestamp64Nano(ts))) / 1e9 "
            "FROM jitterscope.alerts WHERE kind = 'request_slo' GROUP BY host, boot_id, seq"))
        summary = run.summary()
    return {"delays": delays, "late": _summed(text, "jitterscope_streams_late_evidence_total "),
            "attributed": _summed(text, "jitterscope_streams_attributions_total "), "summary": summary}


def bench_request_alert_delay(rounds: int = int(os.environ.get("BENCH_ALERT_ROUNDS", "2"))) -> str:
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        before_tree = baseline_tree(Path(tmp), BEFORE, BASELINE_FILES)
        for r in range(rounds):
            for label in (("before", "after") if r % 2 == 0 else ("after", "before")):
                result = requests_under_up(before_tree if label == "before" else None)
                runs[label].append(result)
                d = result["delays"]
                print(f"<!-- round {r} {label}: {len(d)} request alerts, p50 {_pct(d, 0.5):.3f} s, "
                      f"p99 {_pct(d, 0.99):.3f} s; late evidence {result['late']:.0f} of "
                      f"{result['attributed']:.0f} attributed; {result['summary']} -->", file=sys.stderr, flush=True)

    def figures(label: str) -> tuple[str, float]:
        d = sorted(x for run in runs[label] for x in run["delays"])
        late = sum(run["late"] for run in runs[label])
        attributed = sum(run["attributed"] for run in runs[label])
        return (f"{quantiles_ms(d)}, max {d[-1] * 1e3 if d else float('nan'):,.0f} ms ({len(d):,} alerts; "
                f"late evidence {late:,.0f} records over {attributed:,.0f} requests)"), _pct(d, 0.99)

    ours, our_p99 = figures("after")
    base, base_p99 = figures("before")
    return (f"| `request_slo` alert delay (raised − request end) under `up`, the stand-in beside the demo's storm "
            f"for {SECONDS:.0f} s, {rounds} alternating rounds | {ours} | the grace period alone (attribution.py "
            f"at {BEFORE}): {base} | p99 {our_p99 / base_p99:.2f}x |\n")
