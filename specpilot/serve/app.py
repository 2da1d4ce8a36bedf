"""The OpenAI-compatible HTTP server over a Backend: FastAPI routes, uvicorn underneath.

Blocking generation runs in a thread pool (a thread per request in flight), so requests are
read, checked and answered while others generate; the backend decides how they share the
engine (BatchBackend: requests share steps; SerialBackend: one at a time). A bad request
is a 4xx with an OpenAI error body and costs the server nothing; a failure inside the
backend is a 500 (or, once a stream has started, an error event) and the server goes on
serving.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from specpilot.failures import one_line
from specpilot.serve.detok import IncrementalText
from specpilot.serve.protocol import (DONE, Parsed, Reply, RequestError, budget, error_body,
                                      parse_json, parse_request, sse, usage)

if TYPE_CHECKING:   # the backends import stock (torch), which `listen` does not need
    from specpilot.serve.backend import Backend

WORKERS = 64   # requests generating or waiting for the backend at once; more wait their turn


def _error(status: int, message: str, kind: str = "invalid_request_error",
           param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind, param), status_code=status)


def _internal(exc: BaseException) -> str:
    return f"internal: {type(exc).__name__}: {one_line(exc) or '(no message)'}"


class Generations:
    """Backend.stream run in the pool, its chunks handed to the event loop."""

    def __init__(self, backend: Backend, workers: int = WORKERS):
        self.backend = backend
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="generate")

    async def chunks(self, ids: list[int], max_new: int) -> AsyncIterator[list[int]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()   # the consumer left (a client hung up): stop at a chunk

        def put(item) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:   # the loop is closed: the server stopped
                pass

        def pump() -> None:
            it = None
            try:
                it = self.backend.stream(ids, max_new)
                for chunk in it:
                    put(("chunk", list(chunk)))
                    if stop.is_set():
                        break
            except BaseException as exc:   # to the consumer, which raises it
                put(("error", exc if isinstance(exc, Exception) else
                     RuntimeError(f"generation stopped by {type(exc).__name__}")))
            finally:
                if it is not None:
                    getattr(it, "close", lambda: None)()
                put(("end", None))   # after an error, never read

        loop.run_in_executor(self.pool, pump)
        try:
            while True:
                what, value = await queue.get()
                if what == "end":
                    return
                if what == "error":
                    raise value
                yield value
        finally:
            stop.set()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def create_app(backend: Backend) -> FastAPI:
    gens = Generations(backend)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        yield
        gens.close()

    app = FastAPI(title="specpilot serve", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        detail = exc.detail if exc.status_code != 404 else \
            f"no such endpoint: {request.method} {request.url.path}"
        return _error(exc.status_code, str(detail), kind)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc: RequestValidationError):
        return _error(400, one_line(exc))

    @app.exception_handler(Exception)
    async def internal_error(request, exc: Exception):
        return _error(500, _internal(exc), "internal_error")

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": backend.name}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": backend.name, "object": "model", "created": started, "owned_by": "specpilot",
            "max_model_len": backend.max_context}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _answer(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _answer(request, "chat")

    async def _answer(request: Request, kind: str):
        try:
            req = parse_request(parse_json(await request.body()), kind)
            param = "messages" if kind == "chat" else "prompt"
            try:
                ids = (backend.encode(req.prompt) if kind == "completion"
                       else backend.encode_chat(req.messages))
            except ValueError as exc:
                raise RequestError(one_line(exc), param) from None
            max_new = budget(len(ids), req.max_tokens, backend.max_context, param)
        except RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        reply = Reply.new(kind, backend.name)
        if req.stream:
            return StreamingResponse(_events(reply, req, ids, max_new),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        out: list[int] = []
        try:
            async for chunk in gens.chunks(ids, max_new):
                out.extend(chunk)
        except Exception as exc:
            return _error(500, _internal(exc), "internal_error")
        return reply.full(backend.decode(out), _finish(out), usage(len(ids), len(out)))

    async def _events(reply: Reply, req: Parsed, ids: list[int], max_new: int):
        text = IncrementalText(backend.decode)
        out: list[int] = []
        if reply.kind == "chat":
            yield sse(reply.chunk(None, first=True))
        try:
            async for chunk in gens.chunks(ids, max_new):
                out.extend(chunk)
                piece = text.feed(chunk)
                if piece:
                    yield sse(reply.chunk(piece))
        except Exception as exc:
            yield sse(error_body(_internal(exc), "internal_error"))
            yield DONE
            return
        rest = text.finish()
        yield sse(reply.chunk(rest or None, _finish(out)))
        if req.include_usage:
            yield sse(reply.usage_chunk(usage(len(ids), len(out))))
        yield DONE

    def _finish(out: list[int]) -> str:
        return "stop" if out and out[-1] in backend.stop_ids else "length"

    return app


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free port); OSError if it cannot."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    """uvicorn's server, saying one line once it accepts connections."""

    def __init__(self, config: uvicorn.Config, ready: str):
        super().__init__(config)
        self.ready = ready

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started:
            print(self.ready, flush=True)


def serve(backend: Backend, sock: socket.socket, detail: str = "") -> bool:
    """Serve on `sock` until stopped (SIGINT, SIGTERM); False if the server never started."""
    config = uvicorn.Config(create_app(backend), log_level="warning", access_log=False,
                            timeout_graceful_shutdown=5, lifespan="on")
    ready = f"serving {backend.name} at {url_of(sock)}/v1" + (f" ({detail})" if detail else "")
    server = _Server(config, ready)
    server.run(sockets=[sock])
    return server.started
