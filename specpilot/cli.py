"""The `specpilot` command: thin. It parses, calls one function, prints."""

from __future__ import annotations

import sys

import click
from click.exceptions import Abort, Exit

from specpilot import failures, lifeline

# click's own exits: help, version, and (click >= 8.2) help shown for a bare group
PASS = (Exit, Abort) + tuple(e for e in (getattr(click.exceptions, "NoArgsIsHelpError", None),)
                             if e is not None)


class Group(click.Group):
    """A click group whose every failure is one line, `error: …` (specpilot/failures.py):
    usage errors included, and a bug as `error: internal: …`; `--debug` adds tracebacks."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except PASS:
            raise
        except click.ClickException as exc:   # the group's own options
            sys.exit(failures.report(exc, "--debug" in args))

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PASS:
            raise
        except Exception as exc:
            sys.exit(failures.report(exc, bool(ctx.params.get("debug"))))
        except KeyboardInterrupt as exc:
            sys.exit(failures.report(exc, bool(ctx.params.get("debug"))))


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specpilot")
@click.option("--debug", is_flag=True, envvar="SPECPILOT_DEBUG",
              help="show the traceback of a failure (also SPECPILOT_DEBUG=1)")
def cli(debug):
    """SpecPilot: find and prove lossless optimizations of a speculative-decoding system."""


def main():
    lifeline.install()   # SIGTERM/SIGINT: stop workers, remove their scratch, exit
    cli()


# Subcommands live in their own modules; registering them here keeps this file a table.
from specpilot.commands import (cycle_cmds, engine_cmds, init_cmds, judge_cmds,  # noqa: E402
                                memory_cmds, w12_cmds, worktree_cmds)

for _module in (engine_cmds, memory_cmds, worktree_cmds, init_cmds, judge_cmds, cycle_cmds,
                w12_cmds):
    _module.register(cli)
