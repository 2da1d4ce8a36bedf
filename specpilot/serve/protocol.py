"""The OpenAI wire format as this server speaks it: request checks (greedy only; anything we
cannot honour is a 400 naming the parameter), response and stream-chunk shapes, error
bodies. Pure functions over plain dicts: no engine, no HTTP.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from dataclasses import dataclass

DEFAULT_MAX_TOKENS = 256   # when a request names none, capped by the room left in the context

# Sampling and output parameters we accept only at the value that leaves greedy decoding
# unchanged: name -> (is it neutral?, what to send instead).
NEUTRAL = {
    "temperature": (lambda v: v == 0, "0 or leave it out: this server decodes greedily"),
    "top_p": (lambda v: v == 1, "1 or leave it out: greedy decoding only"),
    "top_k": (lambda v: v in (0, -1), "-1 or leave it out: greedy decoding only"),
    "min_p": (lambda v: v == 0, "0 or leave it out: greedy decoding only"),
    "n": (lambda v: v == 1, "1 or leave it out: one greedy choice per request"),
    "best_of": (lambda v: v == 1, "1 or leave it out: one greedy choice per request"),
    "frequency_penalty": (lambda v: v == 0, "0 or leave it out: no penalties"),
    "presence_penalty": (lambda v: v == 0, "0 or leave it out: no penalties"),
    "repetition_penalty": (lambda v: v == 1, "1 or leave it out: no penalties"),
    "logprobs": (lambda v: v is False or v == 0, "leave it out: log-probabilities are not served"),
    "top_logprobs": (lambda v: v == 0, "leave it out: log-probabilities are not served"),
    "echo": (lambda v: v is False, "false or leave it out"),
    "logit_bias": (lambda v: v == {}, "leave it out: no logit bias"),
    "stop": (lambda v: v in ([], ""), "leave it out: replies end at the model's stop tokens"),
    "suffix": (lambda v: v == "", "leave it out: no insertion"),
    "tools": (lambda v: v == [], "leave it out: no tool calls"),
    "tool_choice": (lambda v: v == "none", "leave it out: no tool calls"),
    "response_format": (lambda v: v == {"type": "text"}, "leave it out: plain text only"),
}
IGNORED = ("user", "seed", "parallel_tool_calls", "metadata", "store")   # no effect on greedy
COMMON = ("model", "max_tokens", "stream", "stream_options")
FIELDS = {"completion": COMMON + ("prompt",),
          "chat": COMMON + ("messages", "max_completion_tokens")}
ROLES = ("system", "user", "assistant")


class RequestError(Exception):
    """A request we refuse: HTTP `status`, an OpenAI error body naming `param`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.param, self.status, self.kind = param, status, kind

    def body(self) -> dict:
        return error_body(str(self), self.kind, self.param)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class Parsed:
    kind: str                    # "completion" | "chat"
    prompt: str | None           # completion
    messages: list[dict] | None  # chat: role and content (text) of each message
    max_tokens: int | None       # None: the default
    stream: bool
    include_usage: bool          # stream_options.include_usage: a last chunk with usage


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(
            exc, json.JSONDecodeError) else ""
        raise RequestError(f"malformed JSON body: {getattr(exc, 'msg', exc)}{where}") from None
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
    return body


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_request(body: dict, kind: str) -> Parsed:
    """The request of endpoint `kind` ("completion" or "chat"), or RequestError."""
    for name, value in body.items():
        if name in FIELDS[kind] or name in IGNORED:
            continue
        if name not in NEUTRAL:
            raise RequestError(f"unknown parameter {name!r}", name)
        neutral, advice = NEUTRAL[name]
        if value is not None and not neutral(value):
            raise RequestError(f"unsupported parameter {name}={json.dumps(value)}: set {advice}",
                               name)
    for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty"):
        if body.get(name) is not None and not _number(body[name]):
            raise RequestError(f"{name} must be a number", name)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model must be a string", "model")
    max_tokens = _max_tokens(body, kind)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError("stream must be true or false", "stream")
    include_usage = _stream_options(body.get("stream_options"))
    if kind == "completion":
        return Parsed(kind, _prompt(body), None, max_tokens, bool(stream), include_usage)
    return Parsed(kind, None, _messages(body), max_tokens, bool(stream), include_usage)


def _max_tokens(body: dict, kind: str) -> int | None:
    names = ("max_tokens", "max_completion_tokens") if kind == "chat" else ("max_tokens",)
    given = [(n, body[n]) for n in names if body.get(n) is not None]
    for name, value in given:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise RequestError(f"{name} must be an integer of at least 1, got "
                               f"{json.dumps(value)}", name)
    return min(v for _, v in given) if given else None


def _stream_options(options) -> bool:
    if options is None:
        return False
    if not isinstance(options, dict):
        raise RequestError("stream_options must be an object", "stream_options")
    for key in options:
        if key not in ("include_usage", "continuous_usage_stats"):
            raise RequestError(f"stream_options: unknown option {key!r}", "stream_options")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise RequestError("stream_options.include_usage must be true or false",
                           "stream_options")
    return usage


def _prompt(body: dict) -> str:
    if "prompt" not in body or body["prompt"] is None:
        raise RequestError("missing field 'prompt' (a string)", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise RequestError(f"prompt: one prompt per request (got a list of {len(prompt)})",
                           "prompt")
    if not isinstance(prompt, str):
        raise RequestError("prompt must be a string (token-id prompts are not served)",
                           "prompt")
    if not prompt:
        raise RequestError("prompt is empty", "prompt")
    return prompt


def _messages(body: dict) -> list[dict]:
    if "messages" not in body or body["messages"] is None:
        raise RequestError("missing field 'messages' (a list of {role, content})", "messages")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content}", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object with role and content", "messages")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise RequestError(f"{where}.role must be one of {', '.join(ROLES)}, got "
                               f"{json.dumps(role)}", "messages")
        if isinstance(content, list):   # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str) for p in content):
                raise RequestError(f"{where}.content: only text parts are served", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestError(f"{where}.content must be a string", "messages")
        out.append({"role": role, "content": content})
    return out


def budget(prompt_len: int, requested: int | None, max_context: int,
           param: str = "prompt") -> int:
    """New tokens to generate: `requested`, or the default capped by the context; a prompt
    (`param`: prompt or messages) or a request that does not fit is a RequestError saying
    the lengths."""
    if prompt_len == 0:
        raise RequestError("the prompt has no tokens", param)
    room = max_context - prompt_len
    if room < 1:
        raise RequestError(f"prompt of {prompt_len} tokens does not fit the context of "
                           f"{max_context} tokens (at most {max_context - 1})", param)
    if requested is None:
        return min(DEFAULT_MAX_TOKENS, room)
    if requested > room:
        raise RequestError(f"prompt of {prompt_len} tokens plus max_tokens {requested} exceeds "
                           f"the context of {max_context} tokens (at most {room} new tokens)",
                           "max_tokens")
    return requested


# -- responses ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Reply:
    """What the responses of one request share."""
    kind: str
    model: str
    id: str
    created: int

    @classmethod
    def new(cls, kind: str, model: str) -> "Reply":
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        return cls(kind, model, f"{prefix}-{secrets.token_hex(12)}", int(time.time()))

    def _head(self, chunk: bool) -> dict:
        obj = ("chat.completion.chunk" if chunk else "chat.completion") if self.kind == "chat" \
            else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, text: str, finish: str, usage: dict) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {**self._head(False), "choices": [choice], "usage": usage}

    def chunk(self, text: str | None, finish: str | None = None, first: bool = False) -> dict:
        """One stream chunk: `text` new (None: none), `finish` on the last, `first` (chat)
        carries the assistant role."""
        if self.kind == "chat":
            delta = {"role": "assistant", "content": ""} if first else (
                {} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, usage: dict) -> dict:
        return {**self._head(True), "choices": [], "usage": usage}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def sse(obj: dict | str) -> str:
    """One server-sent event: `data: <json>` (or `data: [DONE]`) and a blank line."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"


DONE = sse("[DONE]")
