"""A load generator for any OpenAI-compatible server: replay a request set, streaming, with
Poisson arrivals at a rate or a fixed number in flight, and report throughput (output
tokens/s, requests/s), time to first token, time per output token and latency (p50, p99)
and the errors.

Per request: TTFT is the time from sending it to the first event carrying text (or, for a
reply without text, such as a lone stop token, the event that ends it); its output
tokens are the server's usage count (stream_options.include_usage) or, where a server
sends no usage, the number of text events; TPOT is (latency - TTFT) / (tokens - 1), over
the replies that came in more than one piece.
Throughput is all output tokens over the wall time from the first send to the last reply.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import httpx
from pydantic import BaseModel
from rich.table import Table

from specpilot.errors import SpecPilotError
from specpilot.failures import one_line
from specpilot.requests import Request, spread

ERROR_SAMPLES = 5   # distinct error messages kept in the report


@dataclass(frozen=True)
class LoadPlan:
    url: str
    requests: list[Request]
    chat: bool = False
    max_tokens: int = 128          # cap on each request's max_new_tokens; 0: no cap
    rate: float | None = None      # Poisson arrivals per second (None: back to back)
    concurrency: int | None = None  # in flight at once (None: 1 without a rate, no cap with)
    seed: int = 0
    timeout: float = 600.0
    model: str | None = None       # None: the server's first model
    warmup: int = 0                # requests sent first, the same way, and not counted


@dataclass
class Outcome:
    id: str
    sent: float = 0.0                 # seconds after the first send
    ttft: float | None = None         # seconds
    latency: float | None = None      # seconds
    output_tokens: int = 0
    text_events: int = 0              # events that carried text
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        """None where the reply came in one piece (a server that does not stream tokens)."""
        if self.ttft is None or self.latency is None or self.output_tokens < 2 \
                or self.text_events < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


class Stats(BaseModel):
    p50: float | None
    p99: float | None
    mean: float | None

    @classmethod
    def of(cls, values: list[float], scale: float = 1.0) -> "Stats":
        xs = [v * scale for v in values]
        return cls(p50=_round(percentile(xs, 50)), p99=_round(percentile(xs, 99)),
                   mean=_round(sum(xs) / len(xs) if xs else None))


class LoadReport(BaseModel):
    url: str
    endpoint: str
    model: str
    arrivals: str                  # "poisson 2/s", "concurrency 4", "poisson 2/s, at most 4"
    requests: int
    completed: int
    errors: int
    duration_s: float
    output_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    ttft_ms: Stats
    tpot_ms: Stats
    latency_s: Stats
    error_messages: list[str] = []
    warmup: int = 0                # requests sent before the measured ones, not counted


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile, linear between order statistics (numpy's default)."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def pick(requests: list[Request], num: int) -> list[Request]:
    """`num` requests spread over the set's categories (then the rest in file order), the
    set repeated when it has fewer."""
    first = spread(requests, min(num, len(requests)))
    seen = {r.id for r in first}
    ordered = first + [r for r in requests if r.id not in seen]
    return [ordered[i % len(ordered)] for i in range(num)]


def arrival_times(n: int, rate: float, seed: int) -> list[float]:
    """Seconds after the start at which each of n requests is sent: a Poisson process."""
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def base_url(url: str) -> str:
    base = url.rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


def payload(req: Request, plan: LoadPlan, model: str) -> dict:
    max_tokens = min(req.max_new_tokens, plan.max_tokens) if plan.max_tokens else \
        req.max_new_tokens
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if plan.chat:
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    return body


def _message(raw: bytes) -> str:
    """The error message of an error body (OpenAI's shape or FastAPI's), else its text."""
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return one_line(raw.decode("utf-8", "replace"))[:200] or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail", obj))
        if isinstance(err, dict) and "message" in err:
            return one_line(err["message"])
        return one_line(json.dumps(err))[:200]
    return one_line(json.dumps(obj))[:200]


async def _first_model(client: httpx.AsyncClient) -> str:
    try:
        resp = await client.get("/v1/models")
    except httpx.HTTPError as exc:
        raise SpecPilotError(f"{client.base_url}: cannot reach the server "
                             f"({type(exc).__name__}: {one_line(exc) or 'no message'})") from None
    if resp.status_code != 200:
        raise SpecPilotError(f"{client.base_url}/v1/models: HTTP {resp.status_code}: "
                             f"{_message(resp.content)} (name one with --model)")
    try:
        return resp.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise SpecPilotError(f"{client.base_url}/v1/models: no model listed "
                             f"(name one with --model)") from None


async def _one(client: httpx.AsyncClient, endpoint: str, body: dict, out: Outcome,
               start: float) -> None:
    sent = time.perf_counter()
    out.sent = sent - start
    usage_tokens = None
    try:
        async with client.stream("POST", endpoint, json=body) as resp:
            if resp.status_code != 200:
                out.error = f"HTTP {resp.status_code}: {_message(await resp.aread())}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    event = json.loads(data)
                except json.JSONDecodeError:
                    out.error = f"malformed stream event: {data[:80]!r}"
                    return
                if not isinstance(event, dict):
                    continue
                if event.get("error"):
                    out.error = f"stream error: {_message(json.dumps(event).encode())}"
                    return
                if isinstance(event.get("usage"), dict):
                    usage_tokens = event["usage"].get("completion_tokens", usage_tokens)
                for choice in event.get("choices") or []:
                    piece = choice.get("text") if "text" in choice else \
                        (choice.get("delta") or {}).get("content")
                    if piece:
                        out.text_events += 1
                    # the first token: the first text, or the end of a reply with none
                    if out.ttft is None and (piece or choice.get("finish_reason")):
                        out.ttft = time.perf_counter() - sent
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {one_line(exc) or 'no message'}"
        return
    out.latency = time.perf_counter() - sent
    out.output_tokens = usage_tokens if isinstance(usage_tokens, int) else out.text_events


def _line(o: Outcome) -> str:
    if o.error:
        return f"{o.id}: error: {o.error}"
    ttft = f" (TTFT {1e3 * o.ttft:.0f} ms)" if o.ttft is not None else ""
    return f"{o.id}: {o.output_tokens} tokens in {o.latency:.2f} s{ttft}"


def _describe(plan: LoadPlan) -> str:
    if plan.rate is None:
        return f"concurrency {plan.concurrency or 1}"
    cap = f", at most {plan.concurrency} in flight" if plan.concurrency else ""
    return f"poisson {plan.rate:g}/s{cap}"


async def _run(plan: LoadPlan, progress: Callable[[str], None]) -> LoadReport:
    n = len(plan.requests)
    timeout = httpx.Timeout(plan.timeout, connect=min(plan.timeout, 10.0))
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url(plan.url), timeout=timeout,
                                 limits=limits) as client:
        model = plan.model or await _first_model(client)
        endpoint = "/v1/chat/completions" if plan.chat else "/v1/completions"
        progress(f"load: {n} requests to {client.base_url}{endpoint} (model {model}), "
                 f"{_describe(plan)}")
        outcomes = [Outcome(r.id) for r in plan.requests]
        done = 0
        start = time.perf_counter()

        async def send(i: int) -> None:
            nonlocal done
            await _one(client, endpoint, payload(plan.requests[i], plan, model), outcomes[i],
                       start)
            done += 1
            progress(f"[{done}/{n}] {_line(outcomes[i])}")

        if plan.rate is None:
            queue = iter(range(n))

            async def worker() -> None:
                for i in queue:
                    await send(i)
            await asyncio.gather(*(worker() for _ in range(min(plan.concurrency or 1, n))))
        else:
            cap = asyncio.Semaphore(plan.concurrency) if plan.concurrency else None

            async def at(i: int, t: float) -> None:
                await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
                if cap is None:
                    await send(i)
                else:
                    async with cap:
                        await send(i)
            await asyncio.gather(*(at(i, t) for i, t in
                                   enumerate(arrival_times(n, plan.rate, plan.seed))))
        duration = time.perf_counter() - start
    return summarize(plan, model, endpoint, outcomes, duration)


def summarize(plan: LoadPlan, model: str, endpoint: str, outcomes: list[Outcome],
              duration: float) -> LoadReport:
    ok = [o for o in outcomes if o.error is None]
    errors = list(dict.fromkeys(o.error for o in outcomes if o.error is not None))
    tokens = sum(o.output_tokens for o in ok)
    return LoadReport(
        url=base_url(plan.url), endpoint=endpoint, model=model, arrivals=_describe(plan),
        requests=len(outcomes), completed=len(ok), errors=len(outcomes) - len(ok),
        duration_s=round(duration, 3), output_tokens=tokens,
        output_tokens_per_s=round(tokens / duration, 3) if duration > 0 else 0.0,
        requests_per_s=round(len(ok) / duration, 4) if duration > 0 else 0.0,
        ttft_ms=Stats.of([o.ttft for o in ok if o.ttft is not None], 1e3),
        tpot_ms=Stats.of([o.tpot for o in ok if o.tpot is not None], 1e3),
        latency_s=Stats.of([o.latency for o in ok if o.latency is not None]),
        error_messages=errors[:ERROR_SAMPLES], warmup=plan.warmup)


def run_load(plan: LoadPlan, progress: Callable[[str], None] = lambda line: None) -> LoadReport:
    """Send the plan's requests and measure them; SpecPilotError if the server cannot be
    reached or names no model. With `plan.warmup` = W, the plan's first W requests (again
    from the first where W passes their number) go first, sent the same way, and are not
    counted: a server's first requests can pay one-time costs (a graph captured, a kernel
    compiled for a new shape)."""
    if not plan.requests:
        raise SpecPilotError("no requests to send")
    if plan.warmup:
        reqs = [plan.requests[i % len(plan.requests)] for i in range(plan.warmup)]
        start = time.perf_counter()
        warm = asyncio.run(_run(replace(plan, requests=reqs, warmup=0),
                                lambda line: progress(f"warm-up {line}")))
        progress(f"warm-up: {warm.requests} requests ({warm.errors} errors) in "
                 f"{time.perf_counter() - start:.1f} s, not counted")
    return asyncio.run(_run(plan, progress))


def report_table(report: LoadReport) -> Table:
    def pair(s: Stats, unit: str, fmt: str) -> str:
        if s.p50 is None:
            return "-"
        return f"{format(s.p50, fmt)} / {format(s.p99, fmt)} {unit}"

    title = f"{report.url}{report.endpoint} ({report.model}), {report.arrivals}"
    table = Table(title=title, min_width=min(len(title), 100))
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("completed / errors", f"{report.completed} / {report.errors}"),
        ("duration", f"{report.duration_s:.2f} s"),
        ("output tokens", f"{report.output_tokens}"),
        ("output tokens/s", f"{report.output_tokens_per_s:.2f}"),
        ("requests/s", f"{report.requests_per_s:.3f}"),
        ("TTFT p50 / p99", pair(report.ttft_ms, "ms", ".0f")),
        ("TPOT p50 / p99", pair(report.tpot_ms, "ms", ".1f")),
        ("latency p50 / p99", pair(report.latency_s, "s", ".2f")),
    ]
    if report.warmup:
        rows.append(("warm-up (not counted)", f"{report.warmup} requests"))
    for row in rows:
        table.add_row(*row)
    for message in report.error_messages:
        table.add_row("error", message)
    return table
