"""The `specpilot` command: thin. It parses, calls one function, prints."""

from __future__ import annotations

import sys

import click

from specpilot.errors import SpecPilotError
from stock.errors import StockError


class Group(click.Group):
    """A click group that turns SpecPilotError into a one-line error and its exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (SpecPilotError, StockError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(getattr(exc, "code", 1))


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specpilot")
def cli():
    """SpecPilot: find and prove lossless optimizations of a speculative-decoding system."""


def main():
    cli()


# Subcommands live in their own modules; registering them here keeps this file a table.
from specpilot.commands import (cycle_cmds, engine_cmds, init_cmds, judge_cmds,  # noqa: E402
                                memory_cmds, w12_cmds, worktree_cmds)

for _module in (engine_cmds, memory_cmds, worktree_cmds, init_cmds, judge_cmds, cycle_cmds,
                w12_cmds):
    _module.register(cli)
