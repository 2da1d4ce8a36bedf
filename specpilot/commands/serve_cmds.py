"""`specpilot serve` and `specpilot load`: the OpenAI-compatible server and its load
generator (specpilot/serve/)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from specpilot.commands.engine_cmds import (build_system, context_opt, device_opt, model_opt,
                                            opt_opt, opts_file_opt)
from specpilot.config import load_config
from specpilot.errors import SpecPilotError
from specpilot.requests import load_dev, load_jsonl

DRAFTER_NAMES = ("auto", "block", "ngram", "draft", "ar")


def _model_name(model: str) -> str:
    return model if model == "embedded" else Path(model).stem if model.endswith(".gguf") \
        else Path(model).name


@click.command("serve")
@click.option("--drafter", default="auto", show_default=True,
              type=click.Choice(DRAFTER_NAMES),
              help="the drafter; 'auto': the block drafter where the model has its weights "
                   "(the embedded default ships them), else n-gram; 'ar': autoregressive")
@click.option("--max-batch", default=8, show_default=True, type=click.IntRange(1, 256),
              help="requests sharing each engine step (continuous batching)")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="0: any free port (the ready line says which)")
@click.option("--system", "system_name", default=None, metavar="NAME",
              help="serve another system than this checkout's stock: 'best' (the validated "
                   "best), a memory entry's id (its tuned options applied) or a commit; its "
                   "code runs confined, as the judges run it")
@click.option("--prepare", is_flag=True,
              help="before listening, capture every CUDA graph a request within the context "
                   "can meet (start-up takes longer; no capture inside a served request)")
@context_opt
@device_opt
@opts_file_opt
@opt_opt
@model_opt
def serve_cmd(drafter, max_batch, host, port, system_name, prepare, max_context, device,
              opts_file, opts, model):
    """Serve a system over OpenAI-compatible HTTP (/v1/completions, /v1/chat/completions,
    /v1/models, /health), greedily, up to --max-batch requests at once in each engine step:
    this checkout's stock, or with --system another one (a memory entry, the validated best
    system, a commit)."""
    # lazy: CLI startup time (the server imports fastapi and uvicorn, the backend torch)
    from specpilot.serve.app import listen, serve

    try:
        sock = listen(host, port)   # before the model loads: a taken port fails at once
    except OSError as exc:
        raise SpecPilotError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    model = model or load_config().model.path
    start = time.perf_counter()
    if system_name:
        # lazy: CLI startup time (memory and git); the name checked before torch loads
        from specpilot.serve.systems import resolve_named

        memory, named, options = resolve_named(system_name, opts_file, opts)
        # lazy: the tokenizer and the device probe import torch
        from specpilot.serve.confined import start_named

        backend, where = start_named(memory, named, options, model, _model_name(model),
                                     drafter, max_batch, prepare, max_context, device,
                                     lambda line: click.echo(line, err=True))
    else:
        # lazy: the backend imports stock's batched engine (torch)
        from specpilot.serve.backend import BatchBackend

        system = build_system(model, opts, opts_file, device, max_context)
        if prepare:
            click.echo(f"preparing the batched engine's graphs (contexts up to "
                       f"{system.engine.max_context}) ...", err=True)
        backend = BatchBackend(system, drafter, _model_name(model), max_batch, prepare=prepare)
        where = str(system.device)
    if prepare:
        click.echo(f"{backend.prepared} graph slots in {time.perf_counter() - start:.1f} s"
                   + ("" if backend.prepared else " (none: no CUDA graphs on this device)"),
                   err=True)
    batching = f"batches of up to {max_batch}"
    detail = (f"drafter {backend.drafter_name}, {where}, context "
              f"{backend.max_context}, {batching}")
    try:
        if not serve(backend, sock, detail):
            raise SpecPilotError("the server did not start")
    finally:
        getattr(backend, "close", lambda: None)()


@click.command("load")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True,
              help="an OpenAI-compatible server (with or without /v1)")
@click.option("--requests", "request_set", default="dev", show_default=True,
              help="'dev' or a JSONL file of requests")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Poisson arrivals at this many requests/s (with --concurrency: a cap)")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="this many requests in flight at once (default 1 without --rate)")
@click.option("--num", default=16, show_default=True, type=click.IntRange(min=1),
              help="requests to send (spread over the set's categories, repeating if short)")
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(min=0),
              help="cap on each request's new tokens (0: the request's own max_new_tokens)")
@click.option("--chat", is_flag=True, help="/v1/chat/completions (default /v1/completions)")
@click.option("--model", default=None, help="model id to send (default: the server's first)")
@click.option("--seed", default=0, show_default=True, type=int, help="arrival times' seed")
@click.option("--timeout", default=600.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True), help="seconds per request")
@click.option("--warmup", default=0, show_default=True, type=click.IntRange(min=0),
              help="requests sent first, the same way, and not counted (a server's one-time "
                   "costs: graphs captured, kernels compiled)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def load_cmd(url, request_set, rate, concurrency, num, max_tokens, chat, model, seed, timeout,
             warmup, as_json):
    """Replay a request set against a server (streaming) and report throughput, TTFT and
    time per output token."""
    from rich.console import Console

    # lazy: CLI startup time (the load generator imports httpx)
    from specpilot.serve.load import LoadPlan, pick, report_table, run_load

    try:
        reqs = load_dev() if request_set == "dev" else load_jsonl(request_set)
    except ValueError as exc:
        raise SpecPilotError(str(exc)) from None
    except OSError as exc:
        raise SpecPilotError(f"{request_set}: {exc.strerror or exc}") from None
    if not reqs:
        raise SpecPilotError(f"{request_set}: no requests")
    plan = LoadPlan(url=url, requests=pick(reqs, num), chat=chat, max_tokens=max_tokens,
                    rate=rate, concurrency=concurrency, seed=seed, timeout=timeout, model=model,
                    warmup=warmup)
    report = run_load(plan, lambda line: click.echo(line, err=True))
    if as_json:
        click.echo(report.model_dump_json(indent=1))
    else:
        Console().print(report_table(report))


def register(cli: click.Group) -> None:
    cli.add_command(serve_cmd)
    cli.add_command(load_cmd)
