# SPDX-License-Identifier: Apache-2.0
"""What README and docs/requests.md tell a newcomer to type exists: every
jitterscope flag they name is accepted by a command, every topic and table
they name is real, every relative link resolves, and the vLLM recipe does
not pin requests to the shell's pid."""

from __future__ import annotations

import re
from pathlib import Path

import click
import typer

from jitterscope.cli import app
from jitterscope.schemas import topics
from jitterscope.streams import clickhouse

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "requests.md"]


def cli_flags() -> set[str]:
    flags = set()

    def walk(command: click.Command) -> None:
        for param in command.params:
            flags.update(o for o in [*param.opts, *param.secondary_opts] if o.startswith("--"))
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    return flags


#: flags of other programs the docs name on their own, in backticks
OTHER_PROGRAMS = {"--system-site-packages"}  # python3 -m venv


def named_flags(text: str) -> set[str]:
    """Flags a doc names on its own (`--flag`, `--flag VALUE`) or on a line
    that runs jitterscope (up to a pipe into another program)."""
    found = set(re.findall(r"`(--[a-z][a-z-]*)(?:[ =][^`]*)?`", text)) - OTHER_PROGRAMS
    for line in text.splitlines():
        if re.match(r"\s*(\S*/)?jitterscope\s", line):
            found.update(re.findall(r"\s(--[a-z][a-z-]*)", re.split(r"[|;#]|&&", line)[0]))
    return found


def test_every_jitterscope_flag_the_docs_name_exists():
    known = cli_flags() | {"--help"}
    for doc in DOCS:
        unknown = named_flags(doc.read_text()) - known
        assert not unknown, f"{doc.name} names flags no command accepts: {sorted(unknown)}"


def table_names() -> set[str]:
    sql = "\n".join(text for _v, _n, text in clickhouse.migrations())
    return set(re.findall(rf"CREATE (?:TABLE|MATERIALIZED VIEW) IF NOT EXISTS {clickhouse.DATABASE}\.(\w+)", sql))


def test_the_topics_and_tables_the_readme_names_are_real():
    readme = (ROOT / "README.md").read_text()
    real_topics = {t.removeprefix("jitterscope.") for t in topics.ALL_TOPICS}
    diagram = readme[readme.index("## How it works"):readme.index("- **The probe**")]
    kafka_line = next(line for line in diagram.splitlines() if "Kafka:" in line)
    named = {n.strip(" .") for n in kafka_line.split("Kafka:")[1].replace("jitterscope.", "").split(",")} - {"..", ""}
    assert named <= real_topics, f"README names topics that do not exist: {sorted(named - real_topics)}"
    tables = set(re.findall(r"\((\w+(?:, \w+)*), \.\.\.\)", diagram)[0].split(", "))
    assert tables <= table_names(), f"README names tables that do not exist: {sorted(tables - table_names())}"


def test_relative_links_resolve_inside_the_repository():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#]+)\)", doc.read_text()):
            if "://" in target:
                continue
            path = (doc.parent / target).resolve()
            assert path.exists() and ROOT in path.parents, f"{doc.name} links {target}, not in the repository"
        assert "../shared/" not in doc.read_text(), f"{doc.name} points outside the repository"


def test_the_vllm_recipe_does_not_give_the_shells_pid():
    text = (ROOT / "docs" / "requests.md").read_text()
    assert "process.pid=$$" not in text
    recipe = text[text.index("### vLLM"):text.index("### Any OpenTelemetry SDK")]
    assert "OTEL_RESOURCE_ATTRIBUTES" not in recipe.split("```")[1], "the command sets a resource pid it cannot know"
