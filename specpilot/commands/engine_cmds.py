"""`specpilot run` and `specpilot bench`: the stock engine's doors."""

from __future__ import annotations

import json

import click

from specpilot.commands.params import device_checked, utf8_checked, warn_if_busy
from specpilot.config import load_config
from specpilot.errors import SpecPilotError


def build_system(model, opts, opts_file, device, max_context=None):
    """The stock system the engine flags name (--model, --opt, --opts-file, --device,
    --max-context); the options are checked before any model loads."""
    # lazy: CLI startup time (stock.system and engine_bench import torch)
    from stock.options import resolve
    from stock.system import load_system

    cfg_model = model or load_config().model.path
    return load_system(cfg_model, resolve(opts, opts_file), device, max_context)


model_opt = click.option("--model", default=None,
                         help="'embedded', a Hugging Face folder or a .gguf file (default: config)")
opt_opt = click.option("--opt", "opts", multiple=True, metavar="NAME=VALUE",
                       help="set an engine option (repeatable)")
opts_file_opt = click.option("--opts-file", type=click.Path(), default=None,
                             help="TOML file of options")
device_opt = click.option("--device", default=None, callback=device_checked,
                          help="cpu, cuda, cuda:1 (default: cuda if present)")
json_opt = click.option("--json", "as_json", is_flag=True, help="machine-readable output")
context_opt = click.option("--max-context", type=click.IntRange(min=1), default=None,
                           help="KV cache size in tokens (default: the model's context)")


def system_options(command):
    """The options every engine command takes: model, engine options, device, context, json."""
    for option in (json_opt, context_opt, device_opt, opts_file_opt, opt_opt, model_opt):
        command = option(command)
    return command


@click.command("run")
@click.argument("prompt")
@click.option("--ar", is_flag=True, help="autoregressive (no drafter)")
@click.option("--drafter", default="ngram", show_default=True, help="ngram | draft | block")
@click.option("--max-new", default=256, show_default=True, type=click.IntRange(min=1))
@click.option("--raw", is_flag=True, help="do not wrap the prompt in the chat template")
@system_options
def run_cmd(prompt, ar, drafter, max_new, raw, model, opts, opts_file, device, max_context,
            as_json):
    """Generate a reply to PROMPT greedily (speculative unless --ar)."""
    if not prompt.strip():
        raise SpecPilotError("empty prompt")
    utf8_checked(prompt, "prompt")
    warn_if_busy()
    system = build_system(model, opts, opts_file, device, max_context)
    ids = system.tokenizer.encode(prompt) if raw else system.tokenizer.chat(prompt)
    res = system.engine.generate(ids, max_new, None if ar else system.drafter(drafter))
    text = system.tokenizer.decode(res.tokens)
    if as_json:
        click.echo(json.dumps({
            "text": text, "tokens": res.tokens, "prompt_tokens": res.prompt_len,
            "mode": "ar" if ar else drafter, "tokens_per_s": round(res.tokens_per_s, 3),
            "accepted_per_step": res.accepted, "tau": round(res.tau, 3),
            "stop_reason": res.stop_reason, "options": system.options.as_dict(),
            "device": str(system.device), "threads": _torch_threads()}))
    else:
        click.echo(text)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


@click.command("bench")
@click.option("--requests", "request_set", default="dev", show_default=True,
              help="'dev' or a JSONL file of requests")
@click.option("--category", "categories", multiple=True, help="only these categories")
@click.option("--limit", default=2, show_default=True, type=click.IntRange(min=0),
              help="requests per category (0: all)")
@click.option("--max-new", default=64, show_default=True, type=click.IntRange(min=1),
              help="cap on new tokens")
@click.option("--modes", default="ar,spec", show_default=True, help="ar, spec, ngram, draft, block, hf")
@click.option("--drafter", default="ngram", show_default=True, help="the drafter 'spec' means")
@system_options
def bench_cmd(request_set, categories, limit, max_new, modes, drafter, model, opts, opts_file,
              device, max_context, as_json):
    """Tokens/s, τ and step time of each mode, side by side on the same requests."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    # lazy: CLI startup time (stock.system and engine_bench import torch)
    from specpilot.engine_bench import parse_modes, run_bench
    from specpilot.requests import load_dev, load_jsonl, select

    try:
        mode_list = parse_modes(modes, drafter)
        reqs = load_dev() if request_set == "dev" else load_jsonl(request_set)
        reqs = select(reqs, list(categories) or None, limit or None)
    except (ValueError, FileNotFoundError) as exc:
        raise SpecPilotError(str(exc)) from exc
    if not reqs:
        raise SpecPilotError("no requests selected")
    warn_if_busy()
    system = build_system(model, opts, opts_file, device, max_context)
    err = Console(stderr=True)
    with Progress(console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("bench", total=len(reqs) * len(mode_list))
        report = run_bench(system, reqs, mode_list, max_new,
                           lambda what: bar.update(task, advance=1, description=what))
    if as_json:
        click.echo(report.model_dump_json(indent=1))
        return
    table = Table(title=f"{report.model} on {report.device} ({report.dtype}, "
                        f"{report.threads} threads), {len(reqs)} requests, ≤{max_new} new tokens")
    for col in ("mode", "tokens/s", "median req tok/s", "τ", "step ms", "× AR", "= AR"):
        table.add_column(col, justify="right")
    for m in report.modes:
        same = "" if m["identical_to_ar"] is None else f"{m['identical_to_ar']}/{m['requests']}"
        table.add_row(m["mode"], f"{m['tokens_per_s']:.2f}", f"{m['median_request_tok_s']:.2f}",
                      "" if m["tau"] is None else f"{m['tau']:.2f}",
                      "" if m["step_ms"] is None else f"{m['step_ms']:.1f}",
                      f"{m.get('speedup_vs_ar', ''):}", same)
    Console().print(table)


def register(cli: click.Group) -> None:
    cli.add_command(run_cmd)
    cli.add_command(bench_cmd)
