# SPDX-License-Identifier: Apache-2.0
"""jitterscope benchmarks. Ratios against a baseline measured in the same
process, because these machines are shared and noisy.

    .venv/bin/python bench/run.py [decode] [pipeline] [probe] [storm] [alert-delay] ...   (default: all)

Prints a Markdown section per benchmark; bench/RESULTS.md keeps the recorded
runs with the command that produced them. This file only dispatches: each
bench lives in the module named below (bench/ is on sys.path when this runs),
and what they share is bench/common.py's.
"""

from __future__ import annotations

import importlib
import os
import platform
import sys
import time

#: bench name -> (its module in bench/, its function): imported only when asked for
BENCHES = {
    "decode": ("pipeline", "bench_decode"),
    "pipeline": ("pipeline", "bench_pipeline"),
    "probe": ("probes", "bench_probe"),
    "peers": ("probes", "bench_probe_peers"),
    "attribution": ("pipeline", "bench_attribution"),
    "hardware": ("probes", "bench_hardware_probes"),
    "saved": ("pipeline", "bench_saved_queries"),
    "storage": ("pipeline", "bench_storage"),
    "storm": ("pipeline", "bench_storm_memory"),
    "footprint": ("probes", "bench_collector_footprint"),
    "pipeline-mix": ("mix", "bench_pipeline_mix"),
    "sink-batch": ("mix", "bench_sink_batch"),
    "store-path": ("store", "bench_store_path"),
    "store-kafka": ("store", "bench_store_kafka"),
    "attribution-mix": ("mix", "bench_attribution_mix"),
    "phase-cost": ("vllm_mix", "bench_phase_cost"),
    "alert-delay": ("alert_delay", "bench_alert_delay"),
    "alert-delay-worker": ("alert_delay", "bench_alert_delay_worker"),
    "alert-delay-steady": ("alert_delay", "bench_alert_delay_steady"),
    "alert-delay-stages": ("alert_delay", "bench_alert_delay_stages"),
    "alert-delay-collector": ("alert_delay", "bench_alert_delay_collector"),
    "request-alert-delay": ("request_delay", "bench_request_alert_delay"),
    "alert-delay-loaded": ("loaded_delay", "bench_alert_delay_loaded"),
    "map-read": ("map_read", "bench_map_read"),
    "vllm-cost": ("vllm_cost", "bench_vllm_cost"),
    "glue": ("blocked", "bench_tracepoint_glue"),
    "vllm-capacity": ("mix", "bench_vllm_capacity"),
    "blocked": ("blocked", "bench_blocked_overhead"),
    "gil": ("blocked", "bench_gil_cost"),
    "gil-accounting": ("blocked", "bench_gil_accounting"),
    "whole-up": ("overhead", "bench_whole_up"),
    "syscall-tracepoints": ("overhead", "bench_syscall_tracepoints"),
    "collector-slices": ("collector_slices", "bench_collector_slices"),
    "collector-priority": ("collector_slices", "bench_collector_priority"),
}


def bench(name: str):
    """The function that runs bench ``name``."""
    module, function = BENCHES[name]
    return getattr(importlib.import_module(module), function)


def main(names: list[str]) -> None:
    names = names or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        sys.exit(f"no bench {', '.join(unknown)}; benches: {', '.join(BENCHES)}")
    print(f"\n### {time.strftime('%Y-%m-%d %H:%M')} — {platform.node()}, {os.cpu_count()} CPUs, "
          f"kernel {platform.release()}\n")
    print(f"`.venv/bin/python bench/run.py {' '.join(names)}`\n")
    print("| what | measured | baseline (same run) | ratio |\n|---|---|---|---|")
    for name in names:
        print(bench(name)(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
