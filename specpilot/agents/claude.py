"""The `anthropic` backend: a Messages-API tool loop confined to the agent's worktree.

Loops while the model asks for tools (`stop_reason == "tool_use"`); `pause_turn` resends the
conversation as is; `max_tokens` asks it to continue briefly; `refusal` ends the agent;
`end_turn` without a submission gets one nudge. Limits: steps, tokens and cost per agent
(and the cycle's cost budget, shared through `ctx.spent`); API errors back off
exponentially. Every request and reply is a line of the JSONL transcript.
"""

from __future__ import annotations

import json
import random
import time

from specpilot.agents.context import AgentContext, commit_worktree
from specpilot.agents.toolspec import TOOLS, dispatch
from specpilot.agents.tools import Workspace
from specpilot.cycle.types import Candidate
from specpilot.errors import SpecPilotError

# USD per million tokens (input, output); unknown models count at the highest.
PRICES = {"haiku": (1.0, 5.0), "sonnet": (3.0, 15.0), "opus": (15.0, 75.0)}
RETRYABLE = {"RateLimitError", "APIConnectionError", "APITimeoutError", "InternalServerError",
             "OverloadedError", "ServiceUnavailableError"}

SYSTEM = """You are a performance engineer working in one git worktree of SpecPilot's stock
speculative-decoding engine (stock/). Implement the direction below as a patch behind a NEW
option registered in stock/options.py whose default reproduces stock bit for bit (an int or
float option declares its range: register(..., min=..., max=...)). Use the
tools; keep the change small; then call submit with the option, the value that switches it
on, a summary and your predicted gain. Your tests and benchmarks are only evidence: separate
gates (default == stock, token forcing) and a paired controller decide."""


def price(model: str) -> tuple[float, float]:
    for key, p in PRICES.items():
        if key in model:
            return p
    return PRICES["opus"]


class Transcript:
    def __init__(self, path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, event: dict) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"schema_version": 1, "t": round(time.time(), 3), **event},
                                default=str) + "\n")


def _plain(block) -> dict:
    if isinstance(block, dict):
        return block
    if hasattr(block, "model_dump"):
        return block.model_dump(exclude_none=True)
    return {k: v for k, v in vars(block).items() if not k.startswith("_")}


def call_with_backoff(fn, log, tries: int = 5, base_s: float = 1.0, sleep=time.sleep, **kw):
    for attempt in range(tries):
        try:
            return fn(**kw)
        except Exception as exc:  # the SDK's error classes, matched by name
            status = getattr(exc, "status_code", None)
            retry = type(exc).__name__ in RETRYABLE or status in (429, 500, 502, 503, 529)
            log({"event": "api_error", "error": f"{type(exc).__name__}: {exc}",
                 "attempt": attempt, "retry": retry and attempt + 1 < tries})
            if not retry or attempt + 1 == tries:
                raise
            sleep(base_s * 2 ** attempt * (1 + random.random() / 4))


class ToolLoop:
    def __init__(self, client, model: str, ws: Workspace, log: Transcript, max_steps: int,
                 max_tokens_total: int, max_cost: float, spent: dict, cycle_cost: float,
                 sleep=time.sleep, system: str = SYSTEM):
        self.client, self.model, self.ws, self.log = client, model, ws, log
        self.max_steps, self.max_tokens_total, self.max_cost = max_steps, max_tokens_total, max_cost
        self.spent, self.cycle_cost, self.sleep = spent, cycle_cost, sleep
        self.system = system
        self.tokens = 0
        self.cost = 0.0

    def run(self, task: str) -> tuple[object | None, str]:
        messages: list[dict] = [{"role": "user", "content": task}]
        nudged = False
        for step in range(self.max_steps):
            if self.tokens >= self.max_tokens_total:
                return None, f"token limit {self.max_tokens_total} reached"
            if self.cost >= self.max_cost or self.spent.get("usd", 0.0) >= self.cycle_cost:
                return None, f"cost limit reached (${self.cost:.2f} agent, " \
                             f"${self.spent.get('usd', 0.0):.2f} cycle)"
            self.log({"event": "request", "step": step, "messages": len(messages)})
            resp = call_with_backoff(self.client.messages.create, self.log, sleep=self.sleep,
                                     model=self.model, max_tokens=8192, system=self.system,
                                     tools=TOOLS, messages=messages)
            self._account(resp)
            content = [_plain(b) for b in resp.content]
            self.log({"event": "reply", "step": step, "stop_reason": resp.stop_reason,
                      "content": content, "tokens": self.tokens, "cost_usd": self.cost})
            messages.append({"role": "assistant", "content": content})
            if resp.stop_reason == "tool_use":
                results = []
                for block in content:
                    if block.get("type") != "tool_use":
                        continue
                    text, is_error = dispatch(self.ws, block["name"], dict(block.get("input") or {}))
                    self.log({"event": "tool", "name": block["name"], "input": block.get("input"),
                              "is_error": is_error, "output": text[:4000]})
                    results.append({"type": "tool_result", "tool_use_id": block["id"],
                                    "content": text, "is_error": is_error})
                messages.append({"role": "user", "content": results})
                if self.ws.submission is not None:
                    return self.ws.submission, "submitted"
            elif resp.stop_reason == "pause_turn":
                continue
            elif resp.stop_reason == "max_tokens":
                messages.append({"role": "user", "content": "Your reply hit max_tokens. "
                                 "Continue with smaller steps (one tool call at a time)."})
            elif resp.stop_reason == "refusal":
                return None, "the model refused"
            else:   # end_turn / stop_sequence without a submission
                if nudged:
                    return None, "ended without submitting"
                nudged = True
                messages.append({"role": "user", "content": "Call submit when the change is "
                                 "ready, or continue working with the tools."})
        return None, f"step limit {self.max_steps} reached"

    def _account(self, resp) -> None:
        usage = getattr(resp, "usage", None)
        i = getattr(usage, "input_tokens", 0) or 0
        o = getattr(usage, "output_tokens", 0) or 0
        self.tokens += i + o
        pi, po = price(self.model)
        usd = (i * pi + o * po) / 1e6
        self.cost += usd
        self.spent["usd"] = self.spent.get("usd", 0.0) + usd


def task_prompt(ctx: AgentContext) -> str:
    d = ctx.direction
    return (f"Direction: {d.title}\nHypothesis: {d.hypothesis}\nTarget factor: {d.target_factor}"
            f"\nEvidence plan: {d.evidence_plan}\nFiles likely touched: {', '.join(d.files)}"
            f"\nSuggested option name: {d.option}\nPredicted gain: {d.predicted_gain:.1%}\n")


def produce(ctx: AgentContext) -> Candidate:
    if ctx.client is None:
        raise SpecPilotError("the anthropic backend needs ANTHROPIC_API_KEY (or a client)")
    ws = Workspace(ctx.worktree, ctx.ex.command_timeout_s, sandboxed=ctx.ex.agent_sandbox)
    loop = ToolLoop(ctx.client, ctx.ex.model, ws, Transcript(ctx.transcript), ctx.ex.agent_steps,
                    ctx.ex.agent_tokens, ctx.ex.agent_cost_usd, ctx.spent, ctx.ex.cycle_cost_usd,
                    ctx.sleep)
    sub, why = loop.run(task_prompt(ctx))
    if sub is None:
        raise SpecPilotError(f"agent gave no patch: {why}")
    commit = commit_worktree(ctx, f"{ctx.direction.id}: {sub.summary[:60]}\n\n{sub.summary}")
    if commit is None:
        raise SpecPilotError("agent submitted but changed nothing in the system paths")
    return Candidate(commit=commit, options={**ctx.base.options, sub.option: sub.value},
                     summary=sub.summary, predicted_gain=sub.predicted_gain, code_changed=True)
