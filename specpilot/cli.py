"""The `specpilot` command: thin. It parses, calls one function, prints."""

from __future__ import annotations

import click

from specpilot import lifeline, threads
from specpilot.failures import OneLineGroup as Group


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specpilot")
@click.option("--debug", is_flag=True, envvar="SPECPILOT_DEBUG",
              help="show the traceback of a failure (also SPECPILOT_DEBUG=1)")
def cli(debug):
    """SpecPilot: find and prove lossless optimizations of a speculative-decoding system."""


def main():
    lifeline.install()   # SIGTERM/SIGINT: stop workers, remove their scratch, exit
    threads.install()    # torch's threads: the cores free now (before torch is imported)
    cli()


# Subcommands live in their own modules; registering them here keeps this file a table.
from specpilot.commands import (cycle_cmds, engine_cmds, init_cmds, judge_cmds,  # noqa: E402
                                memory_cmds, serve_cmds, w12_cmds, worktree_cmds)

for _module in (engine_cmds, memory_cmds, worktree_cmds, init_cmds, judge_cmds, cycle_cmds,
                w12_cmds, serve_cmds):
    _module.register(cli)
