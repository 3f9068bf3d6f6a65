# SPDX-License-Identifier: Apache-2.0
"""Every BPF program in bpf/ ships a demonstration, as libbpf-tools ships one
per tool: bpf/<name>_example.txt next to bpf/<name>.bpf.c, from a real run
(the commands as typed, after a ``# `` prompt, each followed by what it
printed) and an OVERHEAD paragraph with the program's measured cost per run
and the command that measured it (the kernel's own BPF statistics)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

BPF = Path(__file__).resolve().parents[2] / "bpf"
PROGRAMS = sorted(p.name.removesuffix(".bpf.c") for p in BPF.glob("*.bpf.c"))


def example(name: str) -> Path:
    return BPF / f"{name}_example.txt"


def commands_and_output(text: str) -> list[tuple[str, list[str]]]:
    """(command, its output lines) for each ``# command`` of a demonstration:
    a command's continuation lines are indented; its output runs to the next
    blank line, ``...`` (output trimmed) left out."""
    found: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("# "):
            i += 1
            continue
        command = lines[i][2:]
        i += 1
        while i < len(lines) and lines[i][:1].isspace() and lines[i].strip():
            command += " " + lines[i].strip()
            i += 1
        output = []
        while i < len(lines) and lines[i].strip() and not lines[i].startswith("# "):
            if lines[i].strip() != "...":
                output.append(lines[i])
            i += 1
        found.append((command, output))
    return found


def overhead(text: str) -> str:
    """The OVERHEAD paragraph and what follows it (its table), '' if none."""
    m = re.search(r"^OVERHEAD\b.*", text, re.M | re.S)
    return m.group(0) if m else ""


def test_there_are_programs_to_check():
    assert "runq" in PROGRAMS and len(PROGRAMS) >= 7, PROGRAMS


@pytest.mark.parametrize("name", PROGRAMS)
def test_each_program_has_an_example_from_a_real_run(name):
    path = example(name)
    assert path.is_file(), f"bpf/{name}.bpf.c has no bpf/{name}_example.txt (see bpf/runq_example.txt)"
    text = path.read_text()
    assert f"bpf/{name}.bpf.c" in text.split("\n\n", 1)[0], "the first paragraph names the program it demonstrates"
    runs = commands_and_output(text)
    assert any(cmd.startswith("jitterscope query") or "jitterscope up" in cmd or "make up" in cmd
               for cmd, _ in runs), "a run through jitterscope up, or a query of what it stored"
    assert any(out for _, out in runs), "at least one command followed by a line of its real output"


@pytest.mark.parametrize("name", PROGRAMS)
def test_each_example_has_an_overhead_paragraph_with_measured_costs(name):
    text = overhead(example(name).read_text())
    assert text, f"bpf/{name}_example.txt has no OVERHEAD paragraph"
    assert re.search(r"\d+ ns", text), "a cost per run, in ns"
    assert "bpf_stats_enabled" in text and "bpftool prog show" in text, "the command that measured it"


def test_the_parser_reads_commands_and_output():
    text = "intro\n\n# jitterscope query -f csv \"SELECT 1\n      AS x\"\nx\n1\n...\n\n# make up\n\nOVERHEAD: 5 ns\n"
    assert commands_and_output(text) == [('jitterscope query -f csv "SELECT 1 AS x"', ["x", "1"]), ("make up", [])]
    assert overhead(text) == "OVERHEAD: 5 ns\n" and overhead("no costs") == ""
