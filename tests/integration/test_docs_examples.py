# SPDX-License-Identifier: Apache-2.0
"""Every fenced example command of README.md and docs/*.md that reads the
store (`jitterscope query`, `query --saved`, `report`, `stacks`, `fix`) runs, as
written, and returns what its text promises (issue 20: the README's example
query once returned 0 rows, and its --remediation-date fell outside the
fleet it was tried on).

Two stores, built the way the README tells a newcomer to build them:

- **the live store**: `jitterscope up` on this host (root, BPF, the embedded
  broker and chDB), with the README's per-request lines beside it, as
  written (`jitterscope demo`: a `jsvictim` thread pinned with `jshog` hogs;
  and the stand-in, `examples/inference_standin.py`, on their CPU), then
  Ctrl-C. It holds run-queue events, alerts naming jsvictim and a jshog, the
  hogs' stacks, and the stand-in's requests with their attributions; the
  console that run printed is checked too (issue 36).
- **the fleet**: the README's own `jitterscope synthetic-fleet --data-dir ...`
  line (300 hosts, 2M run-queue events over 24 h, the injected answers of
  reports/synthetic.py). The fleet block's commands run against it, but
  `stacks`: the synthetic fleet has no stacks, so those run on the live store.

Every `jitterscope` command found in a fenced block is either run here or
named in NOT_RUN with why, so a new example needs a decision. A query must
exit 0 and print at least one row (its text shows rows); `report` must write
a report whose before/after compares both sides; `stacks` must name a stack.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from jitterscope.broker import free_port
from jitterscope.workload import HOG_COMM, VICTIM_COMM

from tests.integration.test_cli import CLI, cli_env
from tests.integration.test_first_hour import descendants

pytestmark = [pytest.mark.integration, pytest.mark.bpf]

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"query", "report", "stacks", "fix"}
#: jitterscope commands in the docs that this test does not run, and why
NOT_RUN = {
    "up": "runs until stopped; this test runs it once to build the live store",
    "demo": "causes the starvation; this test runs it once to build the live store",
    "synthetic-fleet": "loads the fleet; this test runs the README's line once to build the fleet store",
    "collector": "needs a Kafka cluster and root (tests/integration/test_pipeline.py runs the collector)",
    "streams": "needs a Kafka cluster and a ClickHouse server (the examples name hosts of a fleet)",
    "topics": "needs a Kafka cluster (tests/integration/test_topics.py)",
    "schema": "pipes DDL into clickhouse-client on a cluster (tests/integration/test_schema.py parses it)",
    "record": "records a host for minutes as root (tests/bpf/test_record.py)",
    "replay": "needs a Kafka with the file's topics (tests/integration/test_record_replay.py)",
    "config": "prints settings (tests/unit/common/test_settings_example.py)",
    "doctor": "checks this host (tests/integration/test_cli.py)",
}
#: ids in the docs that stand for one of the reader's requests: replaced by the live store's slowest
PLACEHOLDER_IDS = ("cmpl-8f2",)
#: the README's per-request lines: the demo in the background, then the stand-in beside it
PER_REQUEST = re.compile(r"^\.venv/bin/(jitterscope demo .*) &\n\.venv/bin/python (examples/inference_standin\.py .*)$",
                         re.M)


def fenced_commands(path: Path) -> list[tuple[int, str]]:
    """(line, command) for each `jitterscope ...` command in a fenced block;
    an indented line continues the command above it."""
    text = path.read_text()
    found = []
    for block in re.finditer(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        first = text[:block.start(1)].count("\n") + 1
        commands: list[list] = []
        for i, line in enumerate(block.group(1).splitlines()):
            if line.startswith((" ", "\t")) and commands:
                commands[-1][1] += " " + line.strip()
            elif line.strip():
                commands.append([first + i, line.strip()])
        found += [(n, c) for n, c in commands if re.match(r"(\S*/)?jitterscope [a-z]", c)]
    return found


def subcommand(command: str) -> str:
    return shlex.split(command, comments=True)[1]


def every_example() -> list[tuple[str, int, str]]:
    return [(p.name, n, c) for p in DOCS for n, c in fenced_commands(p)]


def test_every_example_is_run_or_says_why_not():
    examples = every_example()
    assert sum(subcommand(c) in RUN for _, _, c in examples) >= 8, examples
    undecided = [(f, n, c) for f, n, c in examples if subcommand(c) not in RUN | set(NOT_RUN)]
    assert undecided == [], "add them to RUN or NOT_RUN (with why)"


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    live, fleet = tmp_path_factory.mktemp("live"), tmp_path_factory.mktemp("fleet")
    (line,) = [c for _, _, c in every_example() if subcommand(c) == "synthetic-fleet"]
    args = shlex.split(line.replace("/tmp/fleet", str(fleet)), comments=True)[1:]
    loaded = subprocess.run([*CLI, *args], env=cli_env(fleet), capture_output=True, text=True, timeout=600)
    assert loaded.returncode == 0, loaded.stderr
    run = build_live_store(live)
    return {"live": live, "fleet": fleet, "run": run}


def per_request_commands(otlp_port: int) -> tuple[list[str], list[str]]:
    """The README's per-request lines, as the reader's shell expands them (it
    names the CPU as $(($(nproc) - 1))): the demo's arguments, and the
    stand-in's command, pointed at this run's receiver (no fixed port)."""
    ((demo, standin),) = PER_REQUEST.findall((ROOT / "README.md").read_text())
    expand = lambda line: subprocess.run(["bash", "-c", "printf '%s\\n' " + line], capture_output=True,  # noqa: E731
                                         text=True, check=True, preexec_fn=every_cpu).stdout.splitlines()
    return expand(demo)[1:], [sys.executable, *expand(standin), "--endpoint", f"http://127.0.0.1:{otlp_port}/v1/traces"]


def every_cpu() -> None:
    """A reader's shell may use every CPU (the tests keep off the last one,
    conftest.py); `nproc` then counts them all, and `up` runs on them all."""
    os.sched_setaffinity(0, range(os.cpu_count() or 1))


@dataclass
class LiveRun:
    """What the live run showed: up's console lines, the pids of up's tree
    (jitterscope's own), the demo CLI's pid, the stand-in's pid and output."""

    console: list[str]
    own: set[int]
    demo_pid: int
    standin_pid: int
    standin_out: str


def build_live_store(data_dir: Path) -> LiveRun:
    otlp = free_port()
    env = cli_env(data_dir, JITTERSCOPE_OTLP_PORT=str(otlp))
    up = subprocess.Popen([*CLI, "up", "--duration", "600", "--broker-port", "0"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, preexec_fn=every_cpu)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(up.stdout.readline, "")), daemon=True).start()
    try:
        wait_for(lambda: any("jitterscope up: watching" in line for line in lines), 360, "up watching", up, lines)
        own = descendants(up.pid)
        demo_args, standin_args = per_request_commands(otlp)
        demo = subprocess.Popen([*CLI, *demo_args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, preexec_fn=every_cpu)
        standin = subprocess.Popen(standin_args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   cwd=ROOT, preexec_fn=every_cpu)
        out, err = standin.communicate(timeout=300)
        assert standin.returncode == 0, err[-2000:]
        assert demo.poll() is None, "the README's demo ended before the stand-in's requests did"
        assert demo.wait(240) == 0, demo.stderr.read()
        requests = int(standin_args[standin_args.index("--requests") + 1])
        counts: dict[str, int] = {}

        def ready() -> bool:
            # every request attributed: the console's request lines are the first of their groups
            counts["attributed requests"] = stored(env, "request_attribution")
            counts[f"{VICTIM_COMM} alerts"] = stored(env, "alerts", f"comm = '{VICTIM_COMM}'")
            return counts["attributed requests"] >= requests and counts[f"{VICTIM_COMM} alerts"] > 0

        wait_for(ready, 240, "attributions and alerts stored", up, lines, seen=counts)
        own |= descendants(up.pid)
    finally:
        up.send_signal(2)  # Ctrl-C, as the README says
        assert up.wait(180) == 0, "".join(lines[-50:])
    return LiveRun(lines, own, demo.pid, standin.pid, out)


def stored(env: dict, table: str, where: str = "1") -> int:
    out = subprocess.run([*CLI, "query", "-f", "json", f"SELECT count() AS n FROM jitterscope.{table} WHERE {where}"],
                         env=env, capture_output=True, text=True, timeout=120)
    return int(json.loads(out.stdout)[0]["n"]) if out.returncode == 0 else -1  # -1: the store did not answer


def wait_for(predicate, timeout: float, what: str, up: subprocess.Popen, lines: list[str],
             seen: dict | None = None) -> None:
    """Poll ``predicate`` until it holds; fail naming what did not happen, the
    last counts it saw (``seen``, filled by the predicate) and up's last lines."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert up.poll() is None, f"up exited while waiting for {what}:\n" + "".join(lines[-50:])
        assert time.monotonic() < deadline, (f"no {what} in {timeout:.0f} s (last seen: {seen}):\n"
                                             + "".join(lines[-20:]))
        time.sleep(1)


def rows_printed(args: list[str], stdout: str) -> int:
    """Rows in `jitterscope query` output, whatever format the example asks for."""
    fmt = args[args.index("-f") + 1].lower() if "-f" in args else "table"
    if fmt == "json":
        return len(json.loads(stdout))
    if fmt == "csv":
        return max(len(stdout.splitlines()) - 1, 0)  # a header line, then the rows
    return sum(line.startswith("│") for line in stdout.splitlines())


def store_for(doc: str, command: str, block_has_fleet: bool) -> str:
    if subcommand(command) in ("stacks", "fix") or not block_has_fleet:
        # the synthetic fleet has no stacks, and a plan is for this host; the quick start and docs/requests.md
        # read this host's
        return "live"
    return "fleet"


def fleet_lines() -> set[tuple[str, int]]:
    """(doc, line) of the commands in a block that loads the synthetic fleet."""
    found = set()
    for path in DOCS:
        commands = fenced_commands(path)
        for block in re.finditer(r"^```[^\n]*\n(.*?)^```", path.read_text(), re.S | re.M):
            if "synthetic-fleet" in block.group(1):
                first = path.read_text()[:block.start(1)].count("\n") + 1
                last = first + block.group(1).count("\n")
                found |= {(path.name, n) for n, _ in commands if first <= n <= last}
    return found


def slowest_request(env: dict) -> str:
    out = subprocess.run([*CLI, "query", "-f", "json", "SELECT request_id FROM jitterscope.request_attribution FINAL "
                          "ORDER BY duration_ns DESC LIMIT 1"], env=env, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout)[0]["request_id"]


EXAMPLES = [e for e in every_example() if subcommand(e[2]) in RUN]


@pytest.mark.parametrize("doc,line,command", EXAMPLES, ids=[f"{d}:{n}" for d, n, _ in EXAMPLES])
def test_the_example_returns_what_it_promises(stores, tmp_path, doc, line, command):
    where = store_for(doc, command, (doc, line) in fleet_lines())
    env = cli_env(stores[where])
    args = shlex.split(command, comments=True)[1:]
    out_file = None
    if ">" in args:  # a shell redirect: the test keeps the output itself
        out_file = tmp_path / args[args.index(">") + 1]
        args = args[:args.index(">")]
    for placeholder in PLACEHOLDER_IDS:
        args = [a.replace(placeholder, slowest_request(env)) if placeholder in a else a for a in args]
    result = subprocess.run([*CLI, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{doc}:{line} {command}\n{result.stderr[-2000:]}"
    if out_file is not None:
        out_file.write_text(result.stdout)
    what = args[0]
    if what == "query":
        assert rows_printed(args, result.stdout) > 0 or "--list-saved" in args, f"{doc}:{line} returned no rows"
        assert result.stdout.strip(), f"{doc}:{line} printed nothing"
    elif what == "report":
        html = (tmp_path / args[args.index("--out") + 1]).read_text()
        assert "Request P999" in html and "→" in html, f"{doc}:{line}: before/after does not compare both sides"
        assert re.search(r'<ul class="worst-hosts"><li>', html), f"{doc}:{line}: the summary names no host"
    elif what == "stacks":
        assert HOG_COMM in result.stdout, f"{doc}:{line} names no {HOG_COMM} stack:\n{result.stdout[:2000]}"
    elif what == "fix":  # the demo's hogs have exited by now: named, as moves or as not offered
        assert HOG_COMM in result.stdout and "request" in result.stdout, f"{doc}:{line}:\n{result.stdout[:2000]}"


#: a run-queue alert's console line (cli/up.py format_alert), and a group's resolution
RUNQ_LINE = re.compile(r"\[(?:warning|critical)\] (?P<comm>.+?) \(pid (?P<pid>\d+), tid \d+\) waited ")
RESOLVED_LINE = re.compile(r"\[resolved\] \w+ of (?P<comm>.+?) \(pid (?P<pid>\d+)\)")
REQUEST_LINE = re.compile(r"\[(?:warning|critical)\] request \S+ \(")


def test_the_per_request_example_shows_its_answer_and_little_else(stores):
    """Issue 36: the README's per-request lines, run as written, show a slow
    request waiting behind jshog on the console, every time; and the console
    is about the processes that matter (the demo's victim, the serving
    stand-in), never a hog, the demo CLI or jitterscope itself as the victim."""
    run: LiveRun = stores["run"]
    assert "done: " in run.standin_out and "wall p50" in run.standin_out, "the stand-in prints its summary"
    requests = [line for line in run.console if REQUEST_LINE.search(line)]
    starved = [line for line in requests if "for a CPU" in line and HOG_COMM in line]
    assert starved, "no request line waiting for a CPU behind jshog:\n" + "".join(run.console[-40:])
    victims = [(m["comm"], int(m["pid"])) for line in run.console
               if (m := RUNQ_LINE.search(line) or RESOLVED_LINE.search(line))]
    about = len(requests) + sum(comm == VICTIM_COMM or pid == run.standin_pid for comm, pid in victims)
    print(f"\n[measured] {len(run.console)} console lines: {len(requests)} slow requests ({len(starved)} behind "
          f"{HOG_COMM}), {len(victims)} run-queue lines by victim {Counter(c for c, _ in victims).most_common(6)}; "
          f"stand-in {run.standin_out.splitlines()[-1]}; e.g.\n{starved[0]}")
    assert about > (len(requests) + len(victims)) / 2, victims
    assert not [v for v in victims if v[0] == HOG_COMM or v[1] in run.own or v[1] == run.demo_pid], victims
    env = cli_env(stores["live"])
    out = subprocess.run([*CLI, "query", "-f", "json", "SELECT DISTINCT pid, comm FROM jitterscope.alerts "
                          "WHERE evidence['state'] NOT IN ('folded', 'quiet')"], env=env, capture_output=True,
                         text=True, timeout=120)
    announced = {(int(r["pid"]), r["comm"]) for r in json.loads(out.stdout)}
    assert announced and not {(p, c) for p, c in announced if p in run.own or p == run.demo_pid or c == HOG_COMM}, \
        announced


def test_every_grafana_panel_answers_from_a_real_up_run(stores):
    """Issue 37, item 4: the shipped dashboard's SQL, macros expanded as the
    ClickHouse data source expands them, returns rows from the store a real
    `up` run filled (the README's per-request lines: the demo's hogs beside
    the stand-in, whose spans carry vLLM's phases)."""
    from tests.grafana import panel_sql, panels

    env, empty = cli_env(stores["live"]), []
    # what a CPU-only host without a GPU, NUMA nodes or a PCIe switch cannot fill
    no_gpu = {"GPU driver call P99 by host (ms)", "Placement findings (NUMA, migrations, PCIe)",
              # and what only a serving engine's /metrics fills (tests/vllm/test_real_vllm.py stores them)
              "vLLM's own P99 TTFT against slow requests by cause"}
    for panel in panels():
        out = subprocess.run([*CLI, "query", "-f", "json", panel_sql(panel)], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, (panel["title"], out.stderr[-2000:])
        if not json.loads(out.stdout) and panel["title"] not in no_gpu:
            empty.append(panel["title"])
    assert empty == [], empty
