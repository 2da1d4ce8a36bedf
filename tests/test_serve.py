"""`specpilot serve` and `specpilot load` (issue 27, items 3-4), against a real server: one
`specpilot serve` subprocess per module on a free localhost port, over a tiny random qwen3
folder (tests/model_folders.py) on the CPU, spoken to over HTTP with httpx. Outputs are
checked against the engine's own greedy output for the same prompt, loaded in this process
from the same folder, and against `specpilot run`.

The folder's eos is set to a token the model produces for PROMPTS[0], so that reply ends at
a stop token (finish_reason "stop") and the others at max_tokens ("length"). The server runs
with the test-only option repeat_work (identical extra forwards per step, same outputs) so
that generation is slow enough for bad requests to be answered while good ones generate.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from model_folders import build, edit_config
from specpilot.lifeline import die_with_parent
from specpilot.serve.backend import TurnLock
from specpilot.serve.detok import IncrementalText
from specpilot.serve.load import arrival_times, percentile

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
       "SPECPILOT_THREADS": "1"}
CONTEXT = 128
MAX_TOKENS = 12
LONG_TOKENS = 96   # the stream that is generating while bad requests are answered
PROMPTS = ["w1 w2 w3", "w5 w9 w2 w7 w5 w9 w2", "w100 w200", "w7 w7 w7 w7",
           "w3 w1 w4 w1 w5 w9 w2 w6", "w42", "w8 w9 w10 w11 w8 w9", "w300 w301 w302"]
LONG = " ".join(f"w{1 + i % 500}" for i in range(CONTEXT + 10))   # does not fit the context


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specpilot", *args], capture_output=True,
                          text=True, env=ENV, cwd=ROOT, timeout=timeout)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(folder, system): the tiny folder, its eos a token of PROMPTS[0]'s reply, and the
    stock system loaded from it (the reference)."""
    from stock.system import load_system

    folder = build(tmp_path_factory.mktemp("serve-model") / "tiny")
    first = load_system(str(folder), device="cpu", max_context=CONTEXT)
    out = first.engine.generate(first.tokenizer.encode(PROMPTS[0]), MAX_TOKENS).tokens
    stop = next(i for i in range(3, MAX_TOKENS - 1) if out[i] not in out[:i])
    edit_config(folder, lambda cfg: {**cfg, "eos_token_id": out[stop]})
    system = load_system(str(folder), device="cpu", max_context=CONTEXT)
    assert len(system.engine.generate(system.tokenizer.encode(PROMPTS[0]), MAX_TOKENS)
               .tokens) == stop + 1
    return folder, system


def _reference(system, prompt: str, max_new: int = MAX_TOKENS) -> tuple[str, list[int]]:
    """The engine's greedy (autoregressive) reply: its text and tokens."""
    tokens = system.engine.generate(system.tokenizer.encode(prompt), max_new).tokens
    return system.tokenizer.decode(tokens), tokens


@pytest.fixture(scope="module")
def refs(model):
    _, system = model
    return {p: _reference(system, p) for p in PROMPTS}


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    """The base URL of a running `specpilot serve` (the default drafter, auto: n-gram on
    this folder, which has no block drafter weights; with --prepare, which on the CPU has
    no graph to capture and says so)."""
    folder, _ = model
    errlog = tmp_path_factory.mktemp("serve-log") / "stderr.txt"
    with errlog.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "specpilot", "serve", "--model", str(folder), "--device",
             "cpu", "--port", "0", "--max-context", str(CONTEXT), "--opt", "repeat_work=20",
             "--prepare"],
            stdout=subprocess.PIPE, stderr=err, text=True, env=ENV, cwd=ROOT,
            preexec_fn=die_with_parent())
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not lines and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert lines, f"no ready line; stderr: {errlog.read_text()}"
        match = re.fullmatch(r"serving tiny at (http://127\.0\.0\.1:\d+)/v1 \(drafter ngram, "
                             rf"cpu, context {CONTEXT}, batches of up to 8\)\n", lines[0])
        assert match, lines[0]
        yield match.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    log = errlog.read_text()
    assert "Traceback" not in log
    assert re.search(rf"preparing the batched engine's graphs \(contexts up to {CONTEXT}\) "
                     r"\.\.\.\n0 graph slots in [\d.]+ s \(none: no CUDA graphs on this "
                     r"device\)\n", log), log


def _events(text: str) -> list:
    """The data of each server-sent event: parsed JSON, or the string '[DONE]'."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def _body(prompt: str, chat: bool, **extra) -> dict:
    key = {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    return {"model": "tiny", **key, "max_tokens": MAX_TOKENS, **extra}


def _path(chat: bool) -> str:
    return "/v1/chat/completions" if chat else "/v1/completions"


def _streamed(events: list, chat: bool) -> tuple[str, str]:
    """(the concatenated text, the finish reason) of a stream's events."""
    assert events[-1] == "[DONE]"
    pieces, finish = [], None
    for e in events[:-1]:
        for c in e["choices"]:
            pieces.append((c["delta"].get("content") or "") if chat else c["text"])
            finish = c["finish_reason"] or finish
    return "".join(pieces), finish


# -- pieces that need no server ---------------------------------------------------------------

def test_incremental_text_never_splits_a_character():
    decode = lambda ids: bytes(ids).decode("utf-8", "replace")   # a byte-level decode
    data = "né 😀 ok".encode()
    inc = IncrementalText(decode)
    pieces = [inc.feed([b]) for b in data] + [inc.finish()]
    assert "".join(pieces) == "né 😀 ok"
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[1:3] == ["", "é"]   # é's first byte alone is held back


def test_percentiles_and_poisson_arrivals():
    assert percentile([3, 1, 2, 4], 50) == 2.5 and percentile([1, 2, 3, 4, 5], 99) == 4.96
    assert percentile([], 50) is None
    times = arrival_times(4000, 8.0, seed=1)
    assert times[0] == 0 and times == sorted(times) and times == arrival_times(4000, 8.0, 1)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert abs(sum(gaps) / len(gaps) - 1 / 8) < 0.01          # mean gap 1/rate
    assert sum(g > 1 / 8 for g in gaps) / len(gaps) == pytest.approx(0.368, abs=0.03)  # e^-1


def test_the_serial_backends_lock_is_first_come_first_served():
    lock, order = TurnLock(), []

    def request(i: int) -> None:
        with lock:
            order.append(i)

    threads = []
    with lock:   # held while eight threads queue up, each holding its ticket before the next
        for i in range(8):
            threads.append(threading.Thread(target=request, args=(i,)))
            threads[-1].start()
            while lock._next != i + 2:
                time.sleep(0.001)
    for t in threads:
        t.join(5)
    assert order == list(range(8))


# -- the server ---------------------------------------------------------------------------------

def test_health_and_models(server):
    health = httpx.get(f"{server}/health")
    assert health.status_code == 200 and health.json() == {"status": "ok", "model": "tiny"}
    models = httpx.get(f"{server}/v1/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in models["data"]] == [
        ("tiny", "model", CONTEXT)]
    missing = httpx.get(f"{server}/v1/nothing")
    assert missing.status_code == 404 and "/v1/nothing" in missing.json()["error"]["message"]


@pytest.mark.parametrize("chat", [False, True])
def test_replies_equal_the_engines_greedy_output_streamed_or_not(server, refs, chat):
    with httpx.Client(base_url=server, timeout=60) as client:
        for prompt in PROMPTS[:3]:
            text, tokens = refs[prompt]
            finish = "stop" if len(tokens) < MAX_TOKENS else "length"
            full = client.post(_path(chat), json=_body(prompt, chat))
            assert full.status_code == 200, full.text
            reply = full.json()
            assert reply["object"] == ("chat.completion" if chat else "text_completion")
            assert reply["model"] == "tiny" and reply["id"] and reply["created"] > 0
            choice = reply["choices"][0]
            assert (choice["message"]["content"] if chat else choice["text"]) == text
            assert choice["finish_reason"] == finish
            assert reply["usage"] == {"prompt_tokens": len(prompt.split()),
                                      "completion_tokens": len(tokens),
                                      "total_tokens": len(prompt.split()) + len(tokens)}

            body = _body(prompt, chat, stream=True, stream_options={"include_usage": True})
            streamed = client.post(_path(chat), json=body)
            assert streamed.status_code == 200
            assert streamed.headers["content-type"].startswith("text/event-stream")
            events = _events(streamed.text)
            assert _streamed(events, chat) == (text, finish)
            assert {e["object"] for e in events[:-1]} == {
                "chat.completion.chunk" if chat else "text_completion"}
            assert len({e["id"] for e in events[:-1]}) == 1
            assert events[-2]["choices"] == [] and events[-2]["usage"] == reply["usage"]
            if chat:
                assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    # both endings were checked: PROMPTS[0] ends at the stop token, another at max_tokens
    assert len(refs[PROMPTS[0]][1]) < MAX_TOKENS
    assert any(len(refs[p][1]) == MAX_TOKENS for p in PROMPTS[1:3])


def test_chat_reply_equals_specpilot_run(server, model):
    folder, _ = model
    run = _cli("run", PROMPTS[1], "--model", str(folder), "--device", "cpu", "--max-new",
               str(MAX_TOKENS), "--max-context", str(CONTEXT), "--json")
    assert run.returncode == 0, run.stderr
    expected = json.loads(run.stdout)
    reply = httpx.post(f"{server}/v1/chat/completions", json=_body(PROMPTS[1], True),
                       timeout=60).json()
    assert reply["choices"][0]["message"]["content"] == expected["text"]
    assert reply["usage"]["completion_tokens"] == len(expected["tokens"])


BAD = [  # (body or raw bytes, the parameter named, words of the message)
    (b'{"prompt": "w1 w2", "max_tokens": ', None, "malformed JSON"),
    ({"prompt": "w1 w2", "temperature": 0.7}, "temperature", "temperature=0.7"),
    ({"prompt": LONG}, "prompt", f"prompt of {CONTEXT + 10} tokens does not fit the context "
                                 f"of {CONTEXT} tokens"),
    ({"prompt": "w1 w2", "max_tokens": CONTEXT}, "max_tokens", f"the context of {CONTEXT}"),
    ({"max_tokens": 4}, "prompt", "missing field 'prompt'"),
    ({"prompt": "w1", "top_p": 0.5}, "top_p", "top_p=0.5"),
    ({"prompt": "w1", "n": 2}, "n", "n=2"),
    ({"prompt": "w1", "logprobs": 3}, "logprobs", "logprobs=3"),
    ({"prompt": "w1", "stop": ["w2"]}, "stop", "stop="),
    ({"prompt": "w1", "frobnicate": 1}, "frobnicate", "unknown parameter"),
    ({"prompt": "w1", "max_tokens": 0}, "max_tokens", "at least 1"),
    ({"prompt": "w1", "stream": "yes"}, "stream", "true or false"),
]


def test_eight_concurrent_clients_complete_while_bad_requests_get_400(server, refs):
    async def good(client, i):
        prompt, chat, stream = PROMPTS[i], i % 2 == 1, i % 4 >= 2
        resp = await client.post(_path(chat), json=_body(prompt, chat, stream=stream))
        assert resp.status_code == 200, resp.text
        if stream:
            text, _ = _streamed(_events(resp.text), chat)
        else:
            c = resp.json()["choices"][0]
            text = c["message"]["content"] if chat else c["text"]
        return prompt, text, time.monotonic()

    async def long(client, started):
        """A stream of LONG_TOKENS tokens that is generating when the bad requests go out:
        `started` is set at its first event; returns (its text, when it ended)."""
        body = _body(PROMPTS[2], False, stream=True, max_tokens=LONG_TOKENS)
        chunks = []
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            async for chunk in resp.aiter_text():
                chunks.append(chunk)
                started.set()
        return _streamed(_events("".join(chunks)), False)[0], time.monotonic()

    async def bad(client, case, chat):
        body, param, words = case
        if chat and isinstance(body, dict) and "prompt" in body:
            body = {**{k: v for k, v in body.items() if k != "prompt"},
                    "messages": [{"role": "user", "content": body["prompt"]}]}
            param = "messages" if param == "prompt" else param
        if chat and isinstance(body, dict) and "prompt" not in body and "messages" not in body:
            param, words = "messages", "missing field 'messages'"
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        resp = await client.post(_path(chat), **kw)
        return resp, param, words, time.monotonic()

    async def main():
        async with httpx.AsyncClient(base_url=server, timeout=120) as client:
            started = asyncio.Event()
            longest = asyncio.create_task(long(client, started))
            goods = [asyncio.create_task(good(client, i)) for i in range(7)]
            await started.wait()
            bads = await asyncio.gather(*(bad(client, case, chat) for case in BAD
                                          for chat in (False, True)))
            # a client that hangs up on a stream costs the server nothing
            async with client.stream("POST", "/v1/completions",
                                     json=_body(PROMPTS[4], False, stream=True)) as resp:
                assert resp.status_code == 200
            return await asyncio.gather(*goods), bads, await longest

    goods, bads, (long_text, long_end) = asyncio.run(main())
    assert [(p, text) for p, text, _ in goods] == [(p, refs[p][0]) for p in PROMPTS[:7]]
    # greedy: the long reply of PROMPTS[2] continues its short one
    assert long_text.startswith(refs[PROMPTS[2]][0]) and len(long_text) > len(refs[PROMPTS[2]][0])
    for resp, param, words, answered in bads:
        assert resp.status_code == 400, (resp.status_code, resp.text)
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param
        assert words in error["message"] and "\n" not in error["message"], error
    # Bad requests are not queued behind generation: every 400 comes while the long stream,
    # which had begun before they were sent, is still generating. (Ordering them against the
    # 12-token replies' ends was the scheduler's call: in CI on 2 cores, 2026-12-03, all 8
    # short replies ended 12 ms before the first 400.)
    assert max(a for *_, a in bads) < long_end
    after = httpx.post(f"{server}/v1/completions", json=_body(PROMPTS[5], False), timeout=60)
    assert after.status_code == 200 and after.json()["choices"][0]["text"] == refs[PROMPTS[5]][0]


# -- the load generator ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def request_file(tmp_path_factory):
    """Four requests that fit (max_new_tokens 5, 8, 12, 20) and one whose prompt does not."""
    path = tmp_path_factory.mktemp("serve-requests") / "reqs.jsonl"
    rows = [{"id": f"r{i}", "category": "t", "prompt": p, "max_new_tokens": n}
            for i, (p, n) in enumerate(zip(PROMPTS[1:5], (5, 8, 12, 20)))]
    rows.append({"id": "too-long", "category": "t", "prompt": LONG, "max_new_tokens": 8})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_load_reports_its_table_and_json(server, model, request_file):
    _, system = model
    table = _cli("load", "--url", server, "--requests", str(request_file), "--num", "5",
                 "--concurrency", "2", "--max-tokens", "8")
    assert table.returncode == 0, table.stderr
    assert re.search(r"completed / errors\s*│\s*4 / 1", table.stdout), table.stdout
    for row in ("output tokens/s", "requests/s", "TTFT p50 / p99", "TPOT p50 / p99"):
        assert row in table.stdout
    assert "does not fit the context" in table.stdout
    assert "[5/5]" in table.stderr and "too-long: error: HTTP 400" in table.stderr

    out = _cli("load", "--url", f"{server}/v1", "--requests", str(request_file), "--num", "6",
               "--rate", "40", "--max-tokens", "8", "--chat", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["requests"], report["completed"], report["errors"]) == (6, 5, 1)
    assert report["endpoint"] == "/v1/chat/completions" and report["model"] == "tiny"
    assert report["arrivals"] == "poisson 40/s"
    # 6 = the 5 requests then r0 again; each capped at 8 new tokens, ends where the engine does
    caps = {p: min(n, 8) for p, n in zip(PROMPTS[1:5], (5, 8, 12, 20))}
    expected = sum(len(_reference(system, p, caps[p])[1]) for p in PROMPTS[1:5]) + \
        len(_reference(system, PROMPTS[1], caps[PROMPTS[1]])[1])
    assert report["output_tokens"] == expected
    assert report["output_tokens_per_s"] > 0 and report["requests_per_s"] > 0
    ttft, latency = report["ttft_ms"], report["latency_s"]
    assert 0 < ttft["p50"] <= ttft["p99"] and latency["p50"] <= latency["p99"]
    assert ttft["p99"] / 1e3 <= latency["p99"] + 1e-3


def test_load_warms_up_first_and_counts_only_the_measured_requests(server, request_file):
    out = _cli("load", "--url", server, "--requests", str(request_file), "--num", "3",
               "--concurrency", "2", "--max-tokens", "4", "--warmup", "2", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["requests"], report["completed"], report["warmup"]) == (3, 3, 2)
    lines = out.stderr.splitlines()
    warm = [i for i, line in enumerate(lines) if line.startswith("warm-up [")]
    measured = [i for i, line in enumerate(lines) if line.startswith("[")]
    assert len(warm) == 2 and len(measured) == 3 and max(warm) < min(measured), lines
    assert any(re.fullmatch(r"warm-up: 2 requests \(0 errors\) in [\d.]+ s, not counted", x)
               for x in lines), lines


def test_load_against_nothing_is_a_one_line_error():
    out = _cli("load", "--url", "http://127.0.0.1:9", "--num", "1")
    assert out.returncode == 1
    assert out.stderr.startswith("error: http://127.0.0.1:9: cannot reach the server")
    assert out.stderr.count("\n") == 1



def test_bad_command_lines_are_one_line_errors(server, tmp_path):
    port = server.rsplit(":", 1)[1]
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text('{"id": "a", "prompt": "w1"}\n')
    cases = [
        (["serve", "--port", port], 1,
         f"cannot listen on 127.0.0.1:{port}: Address already in use"),
        (["serve", "--drafter", "magic"], 2, "'magic' is not one of"),
        (["load", "--requests", str(tmp_path / "none.jsonl")], 1, "No such file or directory"),
        (["load", "--requests", str(bad_jsonl)], 1, "bad.jsonl:1: invalid request: missing field"),
        (["load", "--rate", "0"], 2, "--rate"),
    ]
    for args, code, words in cases:
        out = _cli(*args)
        assert (out.returncode, out.stderr.count("\n")) == (code, 1), (args, out.stderr)
        assert out.stderr.startswith("error: ") and words in out.stderr, (args, out.stderr)


def test_both_backends_stream_the_engines_tokens_the_batched_one_a_step_at_a_time(model, refs):
    """The server's two backends over the same system: BatchBackend (the default: requests
    share steps; the block drafter batched too) and SerialBackend (one at a time)."""
    from specpilot.serve.backend import BatchBackend, SerialBackend

    _, system = model
    batched = BatchBackend(system, "ngram", "tiny", max_batch=3)
    serial = SerialBackend(system, "ngram", "tiny")
    for prompt in PROMPTS[:4]:
        ids = system.tokenizer.encode(prompt)
        chunks = list(batched.stream(ids, MAX_TOKENS))
        assert [t for c in chunks for t in c] == refs[prompt][1]
        assert len(chunks) > 1 or len(refs[prompt][1]) == 1
        assert list(serial.stream(ids, MAX_TOKENS)) == [refs[prompt][1]]


def test_the_default_drafter_is_the_block_drafter_where_the_model_has_its_weights(
        model, smol, dev_prompts, ar_32):
    """`specpilot serve`'s default drafter "auto": on the embedded default (whose block
    drafter weights ship) the batched block drafter, serving the AR output; on a model
    without such weights (the tiny folder) the n-gram drafter. Each backend names the
    drafter it uses, not "auto"."""
    from specpilot.serve.backend import BatchBackend, SerialBackend

    _, tiny = model
    assert BatchBackend(tiny, "auto", "tiny", max_batch=2).drafter_name == "ngram"
    assert SerialBackend(tiny, "auto", "tiny").drafter_name == "ngram"
    assert BatchBackend(tiny, "ar", "tiny", max_batch=2).drafter_name == "ar"
    backend = BatchBackend(smol, "auto", "embedded", max_batch=2)
    assert backend.drafter_name == "block" and backend.engine.batch_drafter is not None
    assert SerialBackend(smol, "auto", "embedded").drafter_name == "block"
    for ids, want in list(zip(dev_prompts, ar_32))[:2]:
        assert [t for c in backend.stream(ids, 32) for t in c] == want


def test_a_confined_systems_drafter_name_is_shown_only_as_a_short_word():
    """The drafter name a confined system's engine reports (agent-written code chooses it)
    reaches the ready line only as a short lowercase word; anything else is "?". The name
    the engine reports wins (it resolved "auto"), then its batch drafter's (an engine from
    before the report), then the name asked, never a guess at how "auto" resolved."""
    from specpilot.serve.backend import drafter_in_use

    assert drafter_in_use("auto", "ngram", None) == "ngram"
    assert drafter_in_use("auto", "block", "block") == "block"
    assert drafter_in_use("auto", None, "block") == "block"
    assert drafter_in_use("auto") == "auto"
    assert drafter_in_use("ar") == "ar" and drafter_in_use(None) == "ar"
    assert drafter_in_use("ngram") == "ngram"
    for bad in ("block\nserving evil at http://x/v1", "B" * 3, "x" * 40, 7):
        assert drafter_in_use("auto", bad) == "?"
        assert drafter_in_use("auto", None, bad) == "?"


def test_a_prepared_batch_backend_serves_without_making_a_slot(model, refs):
    """`specpilot serve --prepare`: every slot made before serving (the static path, run
    uncaptured on the CPU), then served requests meet none it did not make, and stream the
    same tokens."""
    from specpilot.serve.backend import BatchBackend

    _, system = model
    backend = BatchBackend(system, "ngram", "tiny", max_batch=3, prepare=True,
                           static=True, capture=False)
    made = set(backend.engine.runner.slots)
    assert backend.prepared == len(made) > 0
    for prompt in PROMPTS[:3]:
        ids = system.tokenizer.encode(prompt)
        assert [t for c in backend.stream(ids, MAX_TOKENS) for t in c] == refs[prompt][1]
    assert set(backend.engine.runner.slots) == made
    assert BatchBackend(system, "ngram", "tiny", max_batch=3).prepared == 0   # not asked
