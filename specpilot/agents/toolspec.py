"""The sub-agent's tools as Anthropic tool definitions, and their dispatch to a Workspace."""

from __future__ import annotations

from specpilot.agents.tools import ToolRefused, Workspace


def _t(name, description, props, required=()):
    return {"name": name, "description": description,
            "input_schema": {"type": "object", "properties": props, "required": list(required)}}


S = {"type": "string"}
TOOLS = [
    _t("list", "List a folder of the worktree.", {"path": S}),
    _t("read", "Read a file (numbered lines).", {"path": S, "start": {"type": "integer"},
                                                 "end": {"type": "integer"}}, ["path"]),
    _t("grep", "Search files for a regular expression.", {"pattern": S, "path": S}, ["pattern"]),
    _t("write", "Create or overwrite a file.", {"path": S, "content": S}, ["path", "content"]),
    _t("edit", "Replace one exact occurrence of old with new in a file.",
       {"path": S, "old": S, "new": S}, ["path", "old", "new"]),
    _t("run", "Run a shell command in the worktree (sandboxed, time-limited).",
       {"command": S, "timeout_s": {"type": "number"}}, ["command"]),
    _t("tests", "Run pytest on a path of the worktree.", {"path": S}),
    _t("bench", "Time a short generation with and without options (name=value,...).",
       {"options": S, "max_new": {"type": "integer"}}),
    _t("submit", "Finish: the option that switches your change on, its value, a summary and "
       "the predicted gain (fraction).",
       {"option": S, "value": S, "summary": S, "predicted_gain": {"type": "number"}},
       ["option", "summary", "predicted_gain"]),
]


def dispatch(ws: Workspace, name: str, args: dict) -> tuple[str, bool]:
    """Run one tool call; returns (text, is_error). Refusals are errors the agent sees."""
    fn = {"list": ws.list, "read": ws.read, "grep": ws.grep, "write": ws.write,
          "edit": ws.edit, "run": ws.run, "tests": ws.tests, "bench": ws.bench}.get(name)
    try:
        if name == "submit":
            text = ws.submit(args.get("option", ""), args.get("summary", ""),
                             args.get("predicted_gain", 0.0))
            ws.submission.value = str(args.get("value", "true"))
            return text, False
        if fn is None:
            return f"unknown tool {name!r}", True
        return fn(**args), False
    except ToolRefused as exc:
        return str(exc), True
    except TypeError as exc:
        return f"bad arguments for {name}: {exc}", True
    except OSError as exc:
        return f"{name}: {exc}", True
