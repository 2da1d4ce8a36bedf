"""`specpilot memory list|show|graph|verify|record|export|import|repair|rebase|amend|
add-result|describe`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from specpilot.errors import SpecPilotError
from specpilot.memory import graph as graph_mod
from specpilot.memory.amend import amend as amend_entry
from specpilot.memory.portable import export_entries, import_entries
from specpilot.memory.rebase import rebase as rebase_entries
from specpilot.memory.record import record as record_entry
from specpilot.memory.store import Memory
from specpilot.memory.verify import verify as verify_entries
from specpilot.memory.repair import repair
from specpilot.memory.results import (add_result, describe, from_comparison, set_option,
                                      typed_in)

SOURCE = click.Choice(["refs", "files"])
JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def _emit(as_json: bool, data, text: str) -> None:
    click.echo(json.dumps(data, indent=2, default=str) if as_json else text)


def _entries(memory: Memory, source: str | None):
    if source is None:  # refs when there are any (after import), else the memory/ folder
        refs = memory.ref_entries()
        return refs if refs else memory.file_entries()
    return memory.entries(source)


@click.group("memory")
def memory_group():
    """Memory entries: commits with a dependency DAG, metadata in notes, exact replay."""


@memory_group.command("list")
@click.option("--source", type=SOURCE, help="refs or files (default: refs, else memory/).")
@JSON
def list_cmd(source, as_json):
    """List entries in dependency order."""
    entries = _entries(Memory(), source)
    graph = graph_mod.graph_json(entries)
    rows = [entries[n["id"]] for n in graph["nodes"]]
    data = [{"id": e.id, "title": e.meta.title, "deps": e.meta.deps, "base": e.meta.base,
             "provenance": e.meta.provenance.kind, "commit": e.commit,
             "stale": any(r.stale for r in e.meta.results),
             "validation": e.meta.validation.status if e.meta.validation else None}
            for e in rows]
    text = "\n".join(
        f"{d['id']:<28} {d['base'][:10]}  {','.join(d['deps']) or '-':<20} "
        f"{d['provenance']:<12} {'stale ' if d['stale'] else ''}"
        f"{d['validation'] + ' ' if d['validation'] else ''}{d['title']}" for d in data)
    _emit(as_json, data, text or "(no memory entries)")


@memory_group.command("show")
@click.argument("entry_id")
@click.option("--source", type=SOURCE)
@JSON
def show_cmd(entry_id, source, as_json):
    """Show one entry's metadata."""
    entries = _entries(Memory(), source)
    if entry_id not in entries:
        raise SpecPilotError(f"no memory entry {entry_id!r}", code=2)
    entry = entries[entry_id]
    data = {"origin": entry.origin, "commit": entry.commit,
            **entry.meta.model_dump(mode="json", exclude_none=True)}
    _emit(as_json, data, f"# {entry.origin}" + (f" ({entry.commit})" if entry.commit else "")
          + "\n" + entry.raw.decode(errors="replace").rstrip())


@memory_group.command("graph")
@click.option("--source", type=SOURCE)
@JSON
def graph_cmd(source, as_json):
    """Draw the dependency DAG as text."""
    entries = _entries(Memory(), source)
    _emit(as_json, graph_mod.graph_json(entries), graph_mod.draw(entries))


@memory_group.command("verify")
@click.argument("ids", nargs=-1)
@click.option("--source", type=click.Choice(["all", "refs", "files"]), default="all",
              show_default=True)
@JSON
def verify_cmd(ids, source, as_json):
    """Replay entries from their base; exit 1 if any does not reproduce."""
    report = verify_entries(Memory(), source, list(ids) or None)
    lines = []
    for src, o in report.outcomes:
        line = f"{o.status:<10} {o.id:<28} ({src})"
        if not o.ok:
            line += f"  {o.error}"
            if o.differing_paths:
                line += "\n           differs: " + ", ".join(o.differing_paths)
        lines.append(line)
    lines.append(f"{len(report.outcomes)} checked: "
                 + ("all reproduce" if report.ok else "NOT all reproduce"))
    _emit(as_json, report.to_json(), "\n".join(lines))
    sys.exit(0 if report.ok else 1)


@memory_group.command("record")
@click.option("--from", "source", required=True, help="Branch, commit or worktree folder.")
@click.option("--id", "entry_id", required=True, help="Entry id (a slug).")
@click.option("--deps", default="", help="Comma-separated dependency ids.")
@click.option("--meta", "meta_file", type=click.Path(exists=True, dir_okay=False,
                                                       path_type=Path))
@click.option("--base", help="Stock commit (default: the deps' base, else the fork point "
                             "of --from with HEAD).")
@click.option("--no-files", is_flag=True, help="Do not write memory/<id>.toml/.patch.")
@JSON
def record_cmd(source, entry_id, deps, meta_file, base, no_files, as_json):
    """Record a branch or worktree as an entry; refuses anything that does not reproduce."""
    dep_ids = [d.strip() for d in deps.split(",") if d.strip()]
    done = record_entry(Memory(), source, entry_id, dep_ids, meta_file, base,
                        write_files=not no_files)
    text = (f"recorded {done.id}: commit {done.commit[:12]}, base {done.base[:12]}, "
            f"tree {done.source_tree[:12]} (reproduced)")
    if done.files:
        text += "\nwrote " + ", ".join(done.files) + " (commit them to share the entry)"
    if done.ignored_paths:
        text += "\nignored (outside the system paths): " + ", ".join(done.ignored_paths)
    _emit(as_json, done.to_json(), text)


@memory_group.command("export")
@click.argument("ids", nargs=-1)
@click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path))
@JSON
def export_cmd(ids, folder, as_json):
    """Write entries from refs + notes to memory/<id>.toml and <id>.patch."""
    moved = export_entries(Memory(), folder, list(ids) or None)
    _emit(as_json, [m.to_json() for m in moved],
          "\n".join(f"exported {m.id}" for m in moved) or "(no memory entries)")


@memory_group.command("import")
@click.argument("ids", nargs=-1)
@click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace entries whose refs differ.")
@JSON
def import_cmd(ids, folder, force, as_json):
    """Create refs + notes from memory/ (each entry must reproduce)."""
    moved = import_entries(Memory(), folder, list(ids) or None, force)
    _emit(as_json, [m.to_json() for m in moved],
          "\n".join(f"{m.action:<9} {m.id} {m.commit[:12]}" for m in moved)
          or "(no memory entries)")


@memory_group.command("repair")
@click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path),
              help="Where the entries' <id>.toml files are (default: memory/).")
@click.option("--drop", multiple=True, metavar="ID",
              help="Move this entry (its note unreadable) to the attic instead; repeatable.")
@JSON
def repair_cmd(folder, drop, as_json):
    """Restore unreadable or missing notes of entry refs from memory/<id>.toml."""
    done = repair(Memory(), folder, list(drop))
    _emit(as_json, [d.to_json() for d in done],
          "\n".join(f"{d.action:<9} {d.id} {d.commit[:12]}" for d in done)
          or "nothing to repair: every entry's note reads")


@memory_group.command("rebase")
@click.option("--onto", required=True, help="The new stock commit.")
@click.option("--resolved", "resolved", multiple=True, metavar="ID=SRC",
              help="A conflict merged by hand: SRC (branch, commit or clean worktree) is the "
                   "new stock with ID's moved dependencies and its change (repeatable).")
@click.argument("ids", nargs=-1)
@JSON
def rebase_cmd(onto, resolved, ids, as_json):
    """Move entries onto a new stock (3-way); results become stale; exit 1 on conflicts."""
    pairs = {}
    for item in resolved:
        eid, sep, src = item.partition("=")
        if not sep or not eid or not src:
            raise SpecPilotError(f"--resolved {item!r}: expected ID=SRC", code=2)
        pairs[eid] = src
    results = rebase_entries(Memory(), onto, list(ids) or None, resolved=pairs)
    lines = []
    for r in results:
        line = f"{r.status:<10} {r.id}"
        if r.new_commit and r.status == "moved":
            line += f" {r.old_commit[:12]} -> {r.new_commit[:12]} (results now stale)"
        if r.kept_both:
            line += (f"; both sides only added lines in {', '.join(r.kept_both)}: "
                     f"kept both (the new stock's first)")
        if r.error:
            line += f"  {r.error}"
        if r.status == "conflict":
            deps = Memory().ref_entries()[r.id].meta.deps
            start = (f"git worktree add DIR {onto}" if not deps else
                     f"git specpilot replay {deps[0]} --onto {onto} --worktree DIR"
                     + (f", then the other dependencies {', '.join(deps[1:])}"
                        if len(deps) > 1 else ""))
            line += (f"\n           merge it by hand there ({start}), edit, commit, then "
                     f"rebase again with --resolved {r.id}=DIR")
        lines.append(line)
    _emit(as_json, [r.to_json() for r in results], "\n".join(lines) or "(no memory entries)")
    sys.exit(0 if all(r.status in ("moved", "unchanged") for r in results) else 1)


@memory_group.command("amend")
@click.argument("entry_id")
@click.option("--from", "source", required=True,
              help="Branch, commit or clean worktree on the entry's base with the new change.")
@click.option("--reason", required=True, help="Why the change was replaced (kept in history).")
@click.option("--no-files", is_flag=True, help="Do not rewrite memory/<id>.toml/.patch.")
@click.option("--deps", default=None,
              help="New dependencies, comma-separated (default: keep them); '' for none.")
@JSON
def amend_cmd(entry_id, source, reason, no_files, deps, as_json):
    """Give an entry a new change on its base (it must reproduce); results become stale."""
    new_deps = None if deps is None else [d.strip() for d in deps.split(",") if d.strip()]
    done = amend_entry(Memory(), entry_id, source, reason, write_files=not no_files,
                       deps=new_deps)
    text = (f"amended {done.id}: {done.old_commit[:12]} -> {done.new_commit[:12]}, tree "
            f"{done.source_tree[:12]} (reproduced; {done.stale_results} results now stale)")
    if done.files:
        text += "\nwrote " + ", ".join(done.files) + " (commit them to share the entry)"
    _emit(as_json, done.to_json(), text)


@memory_group.command("add-result")
@click.argument("entry_id")
@click.option("--comparison", "comparison", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A controller report: the output of `specpilot compare --json`.")
@click.option("--gain", type=float, default=None,
              help="Without a report: the gain as a fraction (0.05 = +5%).")
@click.option("--lower-bound", type=float, default=None, help="Without a report: its bound.")
@click.option("--hardware", default="", help="Without a report: where it was measured.")
@click.option("--model", default="", help="Without a report: the model.")
@click.option("--verdict", default="", help="Without a report: the controller's verdict.")
@click.option("--stale", is_flag=True,
              help="Measured on an earlier commit of the entry (before a rebase).")
@click.option("--note", default="", help="Appended to the recorded verdict.")
@click.option("--no-files", is_flag=True, help="Do not rewrite memory/<id>.toml.")
@JSON
def add_result_cmd(entry_id, comparison, gain, lower_bound, hardware, model, verdict, stale,
                   note, no_files, as_json):
    """Attach a controller verdict to an entry's metadata (its note; the tree is unchanged).
    From a report (--comparison), or typed in (--gain, --lower-bound, --hardware, --model,
    --verdict) when the report itself did not survive."""
    if (comparison is None) == (gain is None):
        raise SpecPilotError("give either --comparison REPORT.json or --gain (with "
                             "--lower-bound, --hardware, --model, --verdict)", code=2)
    result = (from_comparison(comparison, note, entry_id) if comparison is not None else
              typed_in(gain, lower_bound, hardware, model, verdict, note))
    if stale:
        result = result.model_copy(update={"stale": True})
    meta = add_result(Memory(), entry_id, result, write_files=not no_files)
    bound = "" if result.ci_low is None else f" (lower bound {result.ci_low:+.2%})"
    _emit(as_json, result.model_dump(mode="json"),
          f"{entry_id}: result {len(meta.results)}: {result.metric} {result.value:+.2%}{bound} "
          f"on {result.hardware or '?'}, {result.model or '?'}: {result.verdict}"
          + (" (stale)" if result.stale else ""))


@memory_group.command("describe")
@click.argument("entry_id")
@click.option("--summary", default=None, help="The entry's new summary.")
@click.option("--applicability", multiple=True,
              help="Replaces the applicability limits; repeat once per item ('' clears).")
@click.option("--untested", multiple=True,
              help="Replaces what is untested; repeat once per item ('' clears).")
@click.option("--no-files", is_flag=True, help="Do not rewrite memory/<id>.toml.")
@JSON
def describe_cmd(entry_id, summary, applicability, untested, no_files, as_json):
    """Rewrite an entry's prose when measurements overtake it: its summary, applicability
    limits or untested list (its note only; the tree, the patch and the results stay)."""
    meta = describe(Memory(), entry_id, summary=summary,
                    applicability=list(applicability) if applicability else None,
                    untested=list(untested) if untested else None, write_files=not no_files)
    _emit(as_json, {"id": entry_id, "summary": meta.summary,
                    "applicability": meta.applicability, "untested": meta.untested},
          f"{entry_id}: summary, {len(meta.applicability)} applicability limit(s), "
          f"{len(meta.untested)} untested item(s)")


@memory_group.command("option")
@click.argument("entry_id")
@click.argument("name")
@click.option("--tuned", default=None, help="The value that switches the entry on, as a "
              "measurement chose it (parsed by the option's type).")
@click.option("--help-text", "help_text", default=None, help="The option's one-line help.")
@click.option("--no-files", is_flag=True, help="Do not rewrite memory/<id>.toml.")
@JSON
def option_cmd(entry_id, name, tuned, help_text, no_files, as_json):
    """List an option the entry's patches register (type and default from its registration;
    `amend` keeps an entry's list as it was) or set a listed option's tuned value and help
    (its note only; the tree and the patch stay)."""
    meta = set_option(Memory(), entry_id, name, tuned=tuned, help=help_text,
                      write_files=not no_files)
    spec = next(o for o in meta.options if o.name == name)
    _emit(as_json, spec.model_dump(mode="json"),
          f"{entry_id}: option {name} ({spec.type}, default {spec.default!r}"
          + (f", tuned {spec.tuned!r}" if spec.tuned is not None else "") + ")")


def register(cli: click.Group) -> None:
    cli.add_command(memory_group)
