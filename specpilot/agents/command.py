"""The `command` backend: your own coding agent, run in the direction's worktree.

`[explore] backend = "command"` with `[explore] agent_command = ["my-agent", "--flag", ...]`
(an argv, no shell; `{option}`, `{title}` and `{direction}` in any argument are filled in).
The task (direction, hypothesis, target factor, evidence plan, the option to register) goes
to its stdin; it runs sandboxed (agents/sandbox.py) with `[explore] agent_timeout_s`; its
changes to the system paths (committed or not) are the patch, switched on by the
direction's option set to "true", captured without running git in the worktree's own
configuration (agents/context.commit_worktree). Its exit status is recorded, not trusted:
the gates and the controller judge what it left.
"""

from __future__ import annotations

from specpilot.agents import sandbox
from specpilot.agents.claude import task_prompt
from specpilot.agents.context import AgentContext, commit_worktree
from specpilot.cycle.types import Candidate
from specpilot.errors import SpecPilotError


def argv_for(template: list[str], direction) -> list[str]:
    fill = {"{option}": direction.option, "{title}": direction.title,
            "{direction}": direction.id}
    out = []
    for arg in template:
        for key, value in fill.items():
            arg = arg.replace(key, value)
        out.append(arg)
    return out


def produce(ctx: AgentContext) -> Candidate:
    if not ctx.ex.agent_command:
        raise SpecPilotError("[explore] agent_command is empty: no external agent configured")
    d = ctx.direction
    res = sandbox.run(argv_for(ctx.ex.agent_command, d), ctx.worktree, ctx.ex.agent_timeout_s,
                      ctx.device_env, stdin=task_prompt(ctx), sandboxed=ctx.ex.agent_sandbox)
    (ctx.log_dir / "command.log").write_text(res.output)
    if res.timed_out:
        raise SpecPilotError(f"agent command killed after {ctx.ex.agent_timeout_s:g} s")
    commit = commit_worktree(ctx, f"{d.id}: external agent")
    if commit is None:
        raise SpecPilotError(f"agent command exited {res.rc} and changed nothing")
    return Candidate(commit=commit, options={**ctx.base.options, d.option: "true"},
                     summary=f"external agent command (exit {res.rc})", code_changed=True)
