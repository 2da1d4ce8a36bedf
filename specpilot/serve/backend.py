"""The seam between the server and an engine: `Backend`; `BatchBackend` over stock's
continuous-batching engine (stock/batch.py: requests share every step, tokens stream a
step at a time), which `specpilot serve` uses for every target, hybrid ones included, and
`SerialBackend` over the single-request system (one request at a time, behind a lock), the
reference the batched one is tested against.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from stock.batch import BackgroundBatch
from stock.system import batch_engine

if TYPE_CHECKING:   # the protocol without torch: only SerialBackend needs a stock System
    from stock.system import System


class Backend(Protocol):
    name: str                      # the model id reported by /v1/models
    max_context: int               # prompt + new tokens limit
    stop_ids: frozenset[int]       # tokens that end a reply (finish_reason "stop")

    def encode(self, text: str) -> list[int]: ...

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of a conversation (messages with string `role` and `content`), the chat
        template applied with the generation prompt; ValueError if the template refuses
        it."""
        ...

    def decode(self, ids: list[int]) -> str: ...

    def stream(self, prompt_ids: list[int], max_new: int) -> Iterator[list[int]]:
        """Blocking generator of the new tokens, a few at a time (one engine step's accepted
        tokens), ending at a stop token (included) or at max_new; safe to call from many
        threads at once."""
        ...


class TurnLock:
    """A lock taken in the order it was asked for (threading.Lock promises no order): the
    requests waiting for a serial engine are served first come, first served."""

    def __init__(self):
        self._cond = threading.Condition()
        self._next = self._serving = 0

    def __enter__(self) -> None:
        with self._cond:
            ticket, self._next = self._next, self._next + 1
            self._cond.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


def drafter_in_use(asked: str | None, reported=None, batch_drafter=None) -> str:
    """The drafter a batched engine speculates with, by name: the one it reports
    (`drafter_name`, set by stock.system.batch_engine, "auto" resolved there), else its batch
    drafter's (a system whose batch_engine predates the report), else the name asked ("ar"
    for none; "auto" stays "auto", unresolved). A confined system's engine reports these, so a
    name that is not a short word is shown as "?"."""
    for name in (reported, batch_drafter):
        if name:
            ok = isinstance(name, str) and re.fullmatch(r"[a-z0-9_-]{1,32}", name)
            return name if ok else "?"
    return "ar" if asked in (None, "", "none", "ar") else asked


class Text:
    """What every backend shares: a stock tokenizer and its chat template, the drafter's
    name, the context and the stop tokens."""

    def __init__(self, tokenizer, drafter: str | None, name: str, max_context: int,
                 stop_ids):
        self.tokenizer = tokenizer
        self.name = name
        self.drafter_name = drafter if drafter not in (None, "", "none") else "ar"
        self.max_context = max_context
        self.stop_ids = frozenset(stop_ids)
        template = tokenizer.chat_template
        # the same environment as stock.tokenizer's, for conversations of more than one turn
        self._template = (ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
                          .from_string(template) if template else None)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        tok = self.tokenizer
        roles = [m["role"] for m in messages]
        # one turn: exactly what `specpilot run` feeds the engine
        if roles == ["user"]:
            return tok.chat(messages[0]["content"])
        if roles == ["system", "user"]:
            return tok.chat(messages[1]["content"], messages[0]["content"])
        if self._template is None:
            return tok.encode("\n".join(m["content"] for m in messages))
        try:
            text = self._template.render(messages=messages, add_generation_prompt=True,
                                         bos_token="", eos_token="")
        except TemplateError as exc:
            raise ValueError(f"messages: the chat template refused them: {exc}") from None
        return tok.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


class _Text(Text):
    """Text over a stock System loaded in this process."""

    def __init__(self, system: System, drafter: str | None, name: str):
        super().__init__(system.tokenizer, drafter, name, system.engine.max_context,
                         system.engine.stop_ids)
        self.system = system


class SerialBackend(_Text):
    """The stock system, one request at a time in arrival order: a TurnLock around
    Engine.generate, whose whole output comes as one chunk (the single-request engine has
    no per-step callback)."""

    def __init__(self, system: System, drafter: str | None, name: str):
        super().__init__(system, drafter, name)
        self._drafter = system.drafter(drafter)   # built once, reset by every generate()
        self.drafter_name = getattr(self._drafter, "name", None) or "ar"   # "auto" resolved
        self._lock = TurnLock()

    def stream(self, prompt_ids: list[int], max_new: int) -> Iterator[list[int]]:
        with self._lock:
            res = self.system.engine.generate(list(prompt_ids), max_new, self._drafter)
        yield res.tokens


class BatchBackend(_Text):
    """Stock's continuous-batching engine on a thread of its own: up to `max_batch`
    requests share each step; each request's tokens stream a step at a time. Each request
    gets a drafter of its own (the n-gram or draft-model drafter), or all share the
    batched block drafter (one forward drafts every row's block)."""

    def __init__(self, system: System, drafter: str | None, name: str, max_batch: int,
                 prepare: bool = False, **engine_kw):
        """`prepare`: before serving, make (on CUDA: capture) every slot a request within
        the context can meet (BatchEngine.prepare), so that no capture, nor a compile of a
        new shape, lands inside a served step; `prepared` says how many exist (0 off the
        static path). `engine_kw` go to the BatchEngine (tests: static=True, capture=False
        runs the static path on the CPU)."""
        super().__init__(system, drafter, name)
        self.max_batch = max_batch
        engine = batch_engine(system.engine, drafter, max_batch, **engine_kw)
        self.drafter_name = drafter_in_use(drafter, getattr(engine, "drafter_name", None),
                                           getattr(engine.batch_drafter, "name", None))
        self.prepared = engine.prepare() if prepare else 0
        self.engine = engine
        self._batch = BackgroundBatch(engine)

    def stream(self, prompt_ids: list[int], max_new: int) -> Iterator[list[int]]:
        yield from self._batch.stream(list(prompt_ids), max_new)
