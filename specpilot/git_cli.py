"""`git specpilot …` (the `git-specpilot` script): `git specpilot replay <entry>`.

Exit codes: 0 reproduced, 1 diverged or failed, 2 usage error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from specpilot.errors import SpecPilotError
from specpilot.failures import OneLineGroup
from specpilot.memory.checkout import replay_one
from specpilot.memory.store import Memory


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
def git_cli():
    """SpecPilot's git door."""


@git_cli.command("replay")
@click.argument("entry_id")
@click.option("--onto", help="Replay onto this stock instead of the entry's base.")
@click.option("--worktree", type=click.Path(path_type=Path),
              help="Check the replayed system out in a new worktree here.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def replay_cmd(entry_id, onto, worktree, as_json):
    """Replay an entry and its dependencies onto stock; compare the tree."""
    try:
        done = replay_one(Memory(), entry_id, onto, worktree)
    except SpecPilotError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2 if exc.code == 2 else 1)
    o = done.outcome
    if as_json:
        click.echo(json.dumps(done.to_json(), indent=2))
    else:
        click.echo(f"entry     {o.id} (from {done.source})")
        click.echo(f"onto      {done.onto or 'its base'}")
        click.echo(f"recorded  {o.expected_tree}")
        click.echo(f"replayed  {o.replayed_tree or '-'}")
        for row in done.per_path:
            mark = "=" if row["recorded"] == row["replayed"] else "≠"
            click.echo(f"  {row['path']:<12} {(row['recorded'] or '?')[:12]} {mark} "
                       f"{(row['replayed'] or '-')[:12]}")
        click.echo(o.status + (f": {o.error}" if o.error else ""))
        for path in o.differing_paths:
            click.echo(f"  differs: {path}")
        if done.worktree:
            click.echo(f"checked out {done.commit[:12]} at {done.worktree}")
    sys.exit(0 if o.ok else 1)


def main():
    git_cli()


if __name__ == "__main__":
    main()
