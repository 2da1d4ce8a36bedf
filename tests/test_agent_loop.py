"""The Anthropic tool loop with the scripted client: stop reasons, limits, backoff, transcript."""

from __future__ import annotations

import json

import pytest
from cycle_fixtures import ScriptedClient, reply, text, tool

from specpilot.agents.claude import ToolLoop, Transcript, call_with_backoff
from specpilot.agents.tools import Workspace


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "wt"
    (root / "stock").mkdir(parents=True)
    (root / "stock" / "a.py").write_text("x = 1\n")
    return Workspace(root, command_timeout_s=10)


def loop(client, ws, tmp_path, steps=10, cost=10.0, spent=None, cycle=10.0):
    return ToolLoop(client, "claude-sonnet-test", ws, Transcript(tmp_path / "t.jsonl"), steps,
                    10**7, cost, {} if spent is None else spent, cycle, sleep=lambda s: None)


def test_tool_results_go_back_and_submit_ends_the_loop(ws, tmp_path):
    client = ScriptedClient([
        reply("tool_use", tool("read", path="stock/a.py"), tool("read", path="../etc/passwd")),
        reply("tool_use", tool("edit", path="stock/a.py", old="x = 1", new="x = 2")),
        reply("tool_use", tool("submit", option="x_two", value="1", summary="s",
                               predicted_gain=0.05)),
    ])
    sub, why = loop(client, ws, tmp_path).run("task")
    assert why == "submitted" and (sub.option, sub.value) == ("x_two", "1")
    results = client.tool_results()
    assert "x = 1" in results[0]["content"] and not results[0]["is_error"]
    assert results[1]["is_error"] and "refused" in results[1]["content"]
    assert (ws.root / "stock" / "a.py").read_text() == "x = 2\n"
    events = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert all(e["schema_version"] == 1 for e in events)
    assert [e["name"] for e in events if e["event"] == "tool"] == ["read", "read", "edit",
                                                                   "submit"]


def test_pause_turn_and_max_tokens_continue_refusal_stops(ws, tmp_path):
    client = ScriptedClient([reply("pause_turn", text("thinking")),
                             reply("max_tokens", text("cut")),
                             reply("refusal")])
    sub, why = loop(client, ws, tmp_path).run("task")
    assert sub is None and why == "the model refused"
    assert client.requests[1]["messages"] == client.requests[0]["messages"] + \
        [{"role": "assistant", "content": [{"type": "text", "text": "thinking"}]}]
    assert "max_tokens" in client.requests[2]["messages"][-1]["content"]


def test_end_turn_gets_one_nudge_then_the_agent_ends(ws, tmp_path):
    client = ScriptedClient([reply("end_turn", text("done?")), reply("end_turn", text("yes"))])
    sub, why = loop(client, ws, tmp_path).run("task")
    assert sub is None and why == "ended without submitting" and len(client.requests) == 2


def test_step_and_cost_limits(ws, tmp_path):
    many = [reply("tool_use", tool("list")) for _ in range(5)]
    sub, why = loop(ScriptedClient(many), ws, tmp_path, steps=3).run("task")
    assert sub is None and "step limit 3" in why
    # 1M input tokens at sonnet prices is $3 > $1: the second request is never sent
    pricey = [reply("tool_use", tool("list"), tokens=(1_000_000, 0)) for _ in range(3)]
    client = ScriptedClient(pricey)
    sub, why = loop(client, ws, tmp_path, cost=1.0).run("task")
    assert "cost limit" in why and len(client.requests) == 1
    spent = {"usd": 50.0}   # the cycle's budget is already spent by other agents
    client = ScriptedClient(list(pricey))
    sub, why = loop(client, ws, tmp_path, spent=spent, cycle=20.0).run("task")
    assert "cost limit" in why and client.requests == []


class RateLimitError(Exception):
    status_code = 429


class BadRequestError(Exception):
    status_code = 400


def test_backoff_retries_rate_limits_exponentially_and_not_bad_requests():
    sleeps, events = [], []
    calls = iter([RateLimitError("slow down"), RateLimitError("again"), "ok"])

    def fn(**kw):
        r = next(calls)
        if isinstance(r, Exception):
            raise r
        return r
    assert call_with_backoff(fn, events.append, sleep=sleeps.append) == "ok"
    assert len(sleeps) == 2 and 1 <= sleeps[0] <= 1.25 and 2 <= sleeps[1] <= 2.5
    with pytest.raises(BadRequestError):
        call_with_backoff(lambda **kw: (_ for _ in ()).throw(BadRequestError("no")),
                          events.append, sleep=sleeps.append)
    assert len(sleeps) == 2 and events[-1]["retry"] is False
