"""How the `specpilot` command reports a failure: one line on stderr, `error: …`.

Expected failures (bad input, a missing or unreadable file, a usage error, an interrupt)
print their own message, which names the file or the field. Anything else is a bug of
ours: `error: internal: <type>: <message>` and a hint to rerun with `--debug`, which adds
the traceback to every failure. Exit codes: the error's own (SpecPilotError.code; click's
2 for usage errors), 130 for an interrupt, 1 otherwise.
"""

from __future__ import annotations

import sys
import traceback

import click
from click.exceptions import Abort, Exit

from specpilot.errors import SpecPilotError
from stock.errors import StockError

EXIT_INTERRUPTED = 130
HINT = "rerun with --debug for the traceback"


def one_line(text: str) -> str:
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def usage_line(exc: click.ClickException) -> str:
    """A click usage error (bad option value, missing argument) on one line."""
    msg = one_line(exc.format_message())
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        msg += f" (see '{ctx.command_path} --help')"
    return msg


def describe(exc: BaseException, debug: bool = False) -> tuple[str, int]:
    """(message, exit code) of a failure; the message starts `internal:` for a bug."""
    if isinstance(exc, SpecPilotError):
        return one_line(exc), exc.code
    if isinstance(exc, StockError):
        return one_line(exc), 1
    if isinstance(exc, click.ClickException):
        return usage_line(exc), exc.exit_code
    if isinstance(exc, (KeyboardInterrupt, click.Abort)):
        return "interrupted", EXIT_INTERRUPTED
    if isinstance(exc, OSError) and exc.filename is not None:
        return one_line(f"{exc.filename}: {exc.strerror or exc}"), 1
    text = one_line(exc) or "(no message)"
    return f"internal: {type(exc).__name__}: {text}" + ("" if debug else f" ({HINT})"), 1


def report(exc: BaseException, debug: bool) -> int:
    """Print the failure (its traceback first with --debug); returns the exit code."""
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    message, code = describe(exc, debug)
    click.echo(f"error: {message}", err=True)
    return code


# click's own exits: help, version, and (click >= 8.2) help shown for a bare group
PASS = (Exit, Abort) + tuple(e for e in (getattr(click.exceptions, "NoArgsIsHelpError", None),)
                             if e is not None)


class OneLineGroup(click.Group):
    """A click group whose every failure is one line, `error: …` (specpilot/failures.py):
    usage errors included, and a bug as `error: internal: …`; `--debug` adds tracebacks."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except PASS:
            raise
        except click.ClickException as exc:   # the group's own options
            sys.exit(report(exc, "--debug" in args))

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PASS:
            raise
        except Exception as exc:
            sys.exit(report(exc, bool(ctx.params.get("debug"))))
        except KeyboardInterrupt as exc:
            sys.exit(report(exc, bool(ctx.params.get("debug"))))
