# SPDX-License-Identifier: Apache-2.0
"""Something to look at without a fleet or an incident: `demo` causes
run-queue starvation on this host (workload.py), `synthetic-fleet` loads a
fleet with known root causes into the embedded store (reports/synthetic.py).
"""

from __future__ import annotations

import shlex
from typing import Annotated, Optional

import typer

from jitterscope.common import settings as settings_mod
from jitterscope.options import ConfigOpt, DataDirOpt, SetOpt, console, load_settings


def demo(
    seconds: Annotated[float, typer.Option(help="how long to run")] = 20.0,
    cpu: Annotated[Optional[int], typer.Option(help="CPU to crowd (default: the last one)")] = None,
    hogs: Annotated[int, typer.Option(help="CPU hogs sharing the victim's CPU (0 = unloaded control)")] = 3,
) -> None:
    """Cause run-queue starvation on purpose: a bursty 'jsvictim' thread pinned with 'jshog' CPU hogs.

    Run it next to 'jitterscope up' to see alerts name jsvictim and a jshog."""
    from jitterscope.workload import HOG_COMM, VICTIM_COMM, last_cpu, starvation

    cpu = last_cpu() if cpu is None else cpu
    with starvation(seconds, cpu, hogs, delay=0) as victim:
        console.print(f"{VICTIM_COMM} (pid {victim.pid}) and {hogs} {HOG_COMM} share CPU {cpu} for {seconds:g}s")


def synthetic_fleet(
    hosts: Annotated[int, typer.Option(help="how many hosts")] = 300,
    events: Annotated[int, typer.Option(help="how many run-queue events (100M takes minutes and ~3 GB; "
                                              "loaded in steps of 5M)")] = 2_000_000,
    hours: Annotated[int, typer.Option(help="over how many past hours")] = 24,
    sets: SetOpt = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Load a synthetic fleet with known root causes into the embedded store, to try saved queries and reports."""
    from rich.progress import Progress

    from jitterscope.reports import synthetic
    from jitterscope.streams import clickhouse

    s = load_settings(config, sets, data_dir=data_dir)
    client = clickhouse.connect(None, s.data_dir)
    clickhouse.migrate(client)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("generating the fleet", total=None)  # the step count depends on --events
        synthetic.load_fleet(client, progress=lambda i, n: progress.update(task, completed=i, total=n),
                             hosts=hosts, runq_events=events, hours=hours)
    client.close()
    # the hints name the store just filled: without --data-dir they would read the default one
    where = "" if s.data_dir == settings_mod.default_data_dir() else f" --data-dir {shlex.quote(str(s.data_dir))}"
    console.print(f"loaded {hosts} hosts and {events:,} run-queue events into {s.data_dir}; try: "
                  f"jitterscope query --saved worst-hosts{where}  or  jitterscope report{where} --out report.html",
                  soft_wrap=True, markup=False)
