# SPDX-License-Identifier: Apache-2.0
"""Alert rules, one module per signal: pure functions from evidence (and
what is known about the host) to an Alert, or None. No I/O, so each rule is
unit-tested directly. streams/handlers.py routes each topic's records to its
signal's rules.

- runq.py: run-queue starvation (jitterscope.runq)
- gpu_ioctl.py: slow GPU driver calls (jitterscope.gpu_ioctl)
- blockio.py: PCIe contention, a busy device on a GPU's switch (jitterscope.device_io)
- migrate.py: CPU migration storms (jitterscope.migrations)
- pages.py: NUMA page placement, remote memory and node fillers (jitterscope.pages)
- processes.py: CPUs off the GPU's NUMA node (jitterscope.processes)
- requests.py: request latency objective (jitterscope.requests, after attribution)
- losses.py: lost events (jitterscope.collector_stats)
- base.py: the thresholds (from Settings) and the shared Alert builder
"""
