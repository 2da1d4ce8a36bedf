"""The `command` backend: an external coding-agent command run in the worktree.

`[explore] command` is a shell template ({option}, {title} are filled in); the task goes to
its stdin; it runs sandboxed with the agent time limit; its changes to the system paths
(committed or not) are the patch, switched on by the direction's option set to "true".
"""

from __future__ import annotations

from specpilot.agents import sandbox
from specpilot.agents.claude import task_prompt
from specpilot.agents.context import AgentContext, commit_worktree
from specpilot.cycle.state import Candidate
from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitStore


def produce(ctx: AgentContext) -> Candidate:
    template = ctx.ex.command
    if not template:
        raise SpecPilotError("[explore] command is empty: no external agent configured")
    d = ctx.direction
    cmd = template.format(option=d.option, title=d.title.replace("'", ""))
    res = sandbox.run(cmd, ctx.worktree, ctx.ex.agent_timeout_s, ctx.device_env,
                      stdin=task_prompt(ctx))
    (ctx.log_dir / "command.log").write_text(res.output)
    if res.timed_out:
        raise SpecPilotError(f"agent command killed after {ctx.ex.agent_timeout_s:g} s")
    commit = commit_worktree(ctx, f"{d.id}: external agent") or \
        GitStore(ctx.worktree).run("rev-parse", "HEAD").strip()
    if commit == ctx.base.commit:
        raise SpecPilotError(f"agent command exited {res.rc} and changed nothing")
    return Candidate(commit=commit, options={**ctx.base.options, d.option: "true"},
                     summary=f"external agent command (exit {res.rc})", code_changed=True)
