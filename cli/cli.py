# SPDX-License-Identifier: Apache-2.0
"""jitterscope: find the kernel-level causes of tail-latency spikes.

Typer CLI. Commands raise typed errors (jitterscope.common.errors); only main() turns
them into one clear line and an exit code.

The commands live in modules named for what they do (roles, reading, fixing,
reporting, capture, deployment, demos, topic_commands); this registers them
on the one app.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from jitterscope import capture, demos, deployment, fixing, reading, reporting, roles
from jitterscope.common import errors
from jitterscope.options import err_console
from jitterscope.topic_commands import topics_app

app = typer.Typer(
    help="Find the kernel-level causes of tail-latency spikes in GPU inference fleets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# in the order `jitterscope --help` lists them; each is named for its function (synthetic_fleet: synthetic-fleet)
for command in (roles.up, roles.collector, roles.streams, roles.broker, reading.query, reading.ledger, reading.stacks,
                fixing.fix, deployment.doctor, demos.demo, reporting.report, deployment.schema, deployment.config,
                demos.synthetic_fleet, capture.record, capture.replay):
    app.command()(command)
app.add_typer(topics_app, name="topics")


def _version(value: bool) -> None:
    if value:
        # the installed distribution's metadata, not a constant here: `pip install` is what a user ran
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"jitterscope {version('jitterscope')}")
        except PackageNotFoundError:  # imported from a checkout that was never installed
            print("jitterscope (not installed: no distribution metadata)")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="print the installed version and exit")] = False,
) -> None:
    """Find the kernel-level causes of tail-latency spikes in GPU inference fleets."""


def main() -> None:
    try:
        app()
    except errors.JitterscopeError as exc:
        # one line, however long: scripts grep it and terminals wrap it themselves
        from rich.markup import escape  # messages quote user input: never markup

        from jitterscope.common.masking import mask_text  # errors mask themselves; this is the last guard

        err_console.print(f"[red]jitterscope:[/] {escape(mask_text(str(exc)))}", soft_wrap=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
