"""`specpilot init`: config, refspecs, notes rewriting, hooks. Idempotent."""

from __future__ import annotations

import json
from pathlib import Path

import click

from specpilot.init import init as init_repo


@click.command("init")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def init_cmd(as_json):
    """Prepare this repository for SpecPilot memory (running it twice changes nothing)."""
    changes = init_repo(Path.cwd())
    if as_json:
        click.echo(json.dumps({"changes": changes}, indent=2))
    else:
        click.echo("\n".join(changes) or "already initialised; nothing changed")


def register(cli: click.Group) -> None:
    cli.add_command(init_cmd)
