"""`specpilot run` and `specpilot bench`: the stock engine's doors."""

from __future__ import annotations

import click


def register(cli: click.Group) -> None:
    pass
