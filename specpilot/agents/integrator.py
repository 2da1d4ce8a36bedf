"""The integration agent (Phase 2): resolves a 3-way conflict between an adopted entry and
the stack built so far, through the same Messages-API tool loop as the sub-agents
(agents/claude.py), confined to the integration worktree.

It runs only when a client is available (ANTHROPIC_API_KEY, or the scripted client in
tests); offline, the cycle drops the conflicting entry with a reason. Its resolution is
accepted only if no conflict markers remain in the system paths; the gates and the
controller then judge the whole stack as usual.
"""

from __future__ import annotations

import re
from pathlib import Path

from specpilot.agents import sandbox
from specpilot.agents.claude import ToolLoop, Transcript
from specpilot.agents.tools import Workspace
from specpilot.cycle.context import CycleContext
from specpilot.errors import SpecPilotError

SYSTEM = """You integrate adopted speculative-decoding patches in one git worktree of
SpecPilot's stock engine (stock/). A 3-way apply left conflict markers (<<<<<<< ||||||| =======
>>>>>>>) in the files listed below. Resolve every conflict so that BOTH changes are kept, each
behind its own option, and every option at its default still reproduces stock bit for bit.
Remove all markers; change nothing else. Then call submit with the later patch's option, the
value "true", a one-line summary of the resolution, and predicted_gain 0."""

MARKER = re.compile(r"^(<<<<<<< |>>>>>>> |\|\|\|\|\|\|\| |=======$)", re.M)


def task(conflicted: list[str], stacked: list, incoming) -> str:
    def one(ds) -> str:
        d, c = ds.direction, ds.candidate
        return (f"- {d.id} (option {d.option}, options {c.options}, measured gain "
                f"{(ds.gain or 0):+.1%}): {d.title}. {c.summary}")
    return ("Stack so far (already applied, keep it):\n" + "\n".join(one(d) for d in stacked)
            + f"\n\nIncoming patch (being applied now):\n{one(incoming)}\n\n"
            f"Files with conflict markers: {', '.join(conflicted)}\n")


def markers_left(root: Path, paths: list[str]) -> list[str]:
    return [p for p in paths if (root / p).is_file()
            and MARKER.search((root / p).read_text(errors="replace"))]


def resolve(ctx: CycleContext, worktree: Path, conflicted: list[str], stacked: list,
            incoming) -> str | None:
    """Ask the agent to resolve the conflict in `worktree`. None on success, else why not."""
    ex = ctx.ex
    try:   # no agent without its sandbox (or the user's explicit opt-out)
        sandbox.policy(ex.agent_sandbox)
    except SpecPilotError as exc:
        return f"integration agent not started: {exc}"
    ws = Workspace(worktree, ex.command_timeout_s, sandboxed=ex.agent_sandbox)
    log = Transcript(ctx.runs.transcript("integrate"))
    log({"event": "conflict", "incoming": incoming.direction.id, "files": conflicted})
    loop = ToolLoop(ctx.client, ex.model, ws, log, ex.agent_steps, ex.agent_tokens,
                    ex.agent_cost_usd, ctx.spent, ex.cycle_cost_usd, ctx.sleep,
                    system=SYSTEM)
    sub, why = loop.run(task(conflicted, stacked, incoming))
    if sub is None:
        return f"integration agent gave no resolution: {why}"
    left = markers_left(worktree, conflicted)
    if left:
        return f"integration agent left conflict markers in {', '.join(left)}"
    log({"event": "resolved", "incoming": incoming.direction.id, "summary": sub.summary})
    return None
