"""`specpilot explore`, `integrate`, `validate` and `runs`: the optimization cycle's doors."""

from __future__ import annotations

import json
import os
import sys
import time

import click

from specpilot.commands.params import warn_if_busy
from specpilot.config import require_root
from specpilot.cycle.state import RunStore, read_runs
from specpilot.errors import SpecPilotError

EXIT_VALIDATION_FAILED = 5


_root = require_root


def make_client():
    """An Anthropic client when ANTHROPIC_API_KEY is set and the SDK is installed."""
    if not os.environ.get("ANTHROPIC_API_KEY"):
        return None
    try:
        import anthropic
    except ImportError:
        click.echo("note: ANTHROPIC_API_KEY is set but `anthropic` is not installed "
                   "(pip install 'specpilot[agents]'); running offline", err=True)
        return None
    return anthropic.Anthropic(max_retries=0)   # the loop does its own backoff


def _drive(cycle_factory, until: str, as_json: bool):
    # lazy: CLI startup time (the cycle's modules load the judges and numpy)
    from specpilot.cycle.display import (PlainView, final_console, footer, make_view,
                                         noise_warnings, summary_table)

    warn_if_busy()
    terminal = not as_json and sys.stderr.isatty()
    view = PlainView() if as_json else make_view(terminal)   # --json: progress on stderr
    holder = {}
    with view:
        cycle = cycle_factory(lambda who, msg: view.update(who, msg, holder["c"].state
                                                           if "c" in holder else None))
        holder["c"] = cycle
        log = cycle.runs.folder / "cycle.log"
        if terminal:   # kept above the live view; off a terminal the line below says it
            view.note(f"run {cycle.state.run_id}; its log: {_shown(log)}")
        view.update("cycle", f"run {cycle.state.run_id}; its log: {_shown(log)}", cycle.state)
        state = cycle.run(until)
        view.update("cycle", f"finished phase {state.phase}", state)
    if as_json:
        click.echo(state.model_dump_json(indent=1))
        return state
    console = final_console(terminal)
    console.print(summary_table(state))
    console.print(footer(state))
    for warning in noise_warnings(state):
        console.print(warning, soft_wrap=True)
    console.print(f"run record: {_shown(log.parent)}/ ({state.wall_s:.0f} s)")
    return state


def _shown(path) -> str:
    """`path` relative to the working folder where it lies inside it."""
    try:
        return str(path.resolve().relative_to(os.getcwd()))
    except ValueError:
        return str(path)


def _exit_for(state) -> None:
    if state.validation is not None and not state.validation.get("passed"):
        raise SystemExit(EXIT_VALIDATION_FAILED)


@click.command("explore")
@click.option("--resume", "resume_id", default=None, metavar="RUN",
              help="continue an interrupted run without redoing finished work")
@click.option("--until", type=click.Choice(["plan", "explore", "integrate", "tune-kernels",
                                            "validate", "done"]), default="done",
              help="stop before this phase (default: run the whole cycle)")
@click.option("--json", "as_json", is_flag=True, help="print the run record as JSON")
def explore_cmd(resume_id, until, as_json):
    """Run one optimization cycle: analyze, plan, explore, integrate, tune kernels,
    validate. Offline without ANTHROPIC_API_KEY. Exit 5 if validation fails."""
    # lazy: CLI startup time (the cycle's modules load the judges and numpy)
    from specpilot.cycle import runner

    root, client = _root(), make_client()
    factory = (lambda p: runner.resume(root, resume_id, p, client)) if resume_id else \
        (lambda p: runner.start(root, p, client))
    _exit_for(_drive(factory, until, as_json))


@click.command("integrate")
@click.option("--run", "run_id", default=None, help="run id (default: the latest)")
@click.option("--again", is_flag=True,
              help="integrate a run that is past integration again (its validation is "
                   "cleared: run `specpilot validate` after)")
@click.option("--json", "as_json", is_flag=True)
def integrate_cmd(run_id, again, as_json):
    """Phase 2 (and 3) of a run: stack its adopted entries and measure them together."""
    # lazy: CLI startup time (the cycle's modules load the judges and numpy)
    from specpilot.cycle import runner

    root = _root()
    rid = runner.find_run(root, run_id)
    reopen = integrated(RunStore(root, rid).load(), again)

    def factory(p):
        c = runner.resume(root, rid, p, make_client())
        if reopen:
            c.state.phase, c.state.finished, c.state.validation = "integrate", None, None
            c.state.notes.append(f"integration re-run by `specpilot integrate --again` at "
                                 f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC; "
                                 f"the earlier validation was cleared")
            c.save()
        return c
    _drive(factory, "validate", as_json)


def integrated(state, again: bool) -> bool:
    """Whether `integrate` re-opens this run: never silently. A run past integration is
    an error without --again (its record, validation included, would be overwritten)."""
    if state.phase not in ("validate", "done"):
        return False
    if not again:
        done = "finished" if state.phase == "done" else "integrated, not yet validated"
        verdict = ""
        if state.validation is not None:
            verdict = f", validation {'passed' if state.validation.get('passed') else 'failed'}"
        raise SpecPilotError(f"run {state.run_id} is {done}{verdict}: `specpilot integrate "
                             f"--again` re-runs its integration and clears its validation"
                             + ("" if state.phase == "done" else
                                "; `specpilot validate` continues it"), code=2)
    return True


@click.command("validate")
@click.option("--run", "run_id", default=None, help="run id (default: the latest)")
@click.option("--json", "as_json", is_flag=True)
def validate_cmd(run_id, as_json):
    """Phase 4 of a run: sealed token forcing and the controller against stock. Only a pass
    moves refs/specpilot/best. Exit 5 on failure."""
    # lazy: CLI startup time (the cycle's modules load the judges and numpy)
    from specpilot.cycle import runner

    root = _root()
    rid = runner.find_run(root, run_id)

    def factory(p):
        c = runner.resume(root, rid, p, None)
        if c.state.phase == "done":
            c.state.phase = "validate"
            c.state.finished = None
        return c
    _exit_for(_drive(factory, "done", as_json))


@click.group("runs")
def runs_group():
    """Run records under .specpilot/runs/."""


@runs_group.command("list")
@click.option("--json", "as_json", is_flag=True)
def runs_list(as_json):
    """The run records, oldest first. Exit 1 if any cannot be read (the readable ones are
    still listed; the first unreadable one is named)."""
    runs, unreadable = read_runs(_root())
    _print_runs(runs, as_json)
    if unreadable:
        more = f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else ""
        raise SpecPilotError(unreadable[0] + more)


def _print_runs(runs, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([{"run_id": r.run_id, "phase": r.phase, "created": r.created,
                                "directions": {d.direction.id: d.status for d in r.directions},
                                "entries": r.entries,
                                "validated": (r.validation or {}).get("passed"),
                                "wall_s": r.wall_s} for r in runs], indent=1))
        return
    for r in runs:
        statuses = ", ".join(f"{d.direction.id}={d.status}" for d in r.directions)
        click.echo(f"{r.run_id}  {r.phase:<12} {r.wall_s:>7.0f}s  {statuses}")


@runs_group.command("show")
@click.argument("run_id", required=False)
@click.option("--json", "as_json", is_flag=True)
def runs_show(run_id, as_json):
    from rich.console import Console

    # lazy: CLI startup time (the cycle's modules load the judges and numpy)
    from specpilot.cycle.display import footer, summary_table
    from specpilot.cycle.runner import find_run
    root = _root()
    state = RunStore(root, find_run(root, run_id)).load()
    if as_json:
        click.echo(state.model_dump_json(indent=1))
        return
    console = Console()
    console.print(summary_table(state))
    console.print(footer(state))


def register(cli: click.Group) -> None:
    for cmd in (explore_cmd, integrate_cmd, validate_cmd, runs_group):
        cli.add_command(cmd)
