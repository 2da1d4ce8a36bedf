"""Checks shared by the commands' parameters: each failure names the parameter."""

from __future__ import annotations

import click

from specpilot import threads
from specpilot.errors import SpecPilotError
from stock.devices import check_device
from stock.errors import StockError


def device_checked(ctx, param, value):
    """--device: a device that exists here, or a usage error naming it."""
    try:
        return check_device(value)
    except StockError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def utf8_checked(text: str, what: str) -> str:
    """Command-line text that must be UTF-8 (argv bytes that are not arrive as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SpecPilotError(f"{what}: not valid UTF-8 (byte {ord(text[exc.start]) - 0xDC00:#04x} "
                             f"at character {exc.start})") from None
    return text


def devices_checked(names: list[str]) -> list[str]:
    """--devices: every name a device that exists here."""
    try:
        return [check_device(name) for name in names]
    except StockError as exc:
        raise SpecPilotError(f"--devices: {exc}", code=2) from None


def warn_if_busy() -> None:
    """A command that times things says so on stderr when the machine was busy at its start."""
    note = threads.busy_note()
    if note:
        click.echo(note, err=True)
