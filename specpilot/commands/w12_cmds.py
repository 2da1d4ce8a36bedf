"""`specpilot w12 convert` and `specpilot w12 stats`: thin doors to kernels/w12/store.py."""

from __future__ import annotations

from pathlib import Path

import click

from specpilot.errors import SpecPilotError


def _model_folder(model: str) -> Path:
    if model == "embedded":
        # lazy: CLI startup time (kernels.w12 and stock.weights import torch)
        from stock.weights import resolve

        return resolve("embedded")
    return Path(model)


@click.group("w12")
def w12_group():
    """Lossless 12-bit weights (W12): convert a model folder, report bits per parameter."""


@w12_group.command("convert")
@click.argument("model_dir")
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--device", default="cpu", help="encode on this device (cuda: the GPU encoder)")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def convert_cmd(model_dir, out_dir, device, as_json):
    """Convert a Hugging Face safetensors folder (or 'embedded') into a W12 folder: 2-D linear
    weights become W12 planes, every other tensor and file is copied."""
    # lazy: CLI startup time (kernels.w12 and stock.weights import torch)
    from kernels.w12.format import W12Error
    from kernels.w12.store import convert_folder, dumps

    try:
        stats = convert_folder(_model_folder(model_dir), out_dir, device)
    except W12Error as exc:
        raise SpecPilotError(str(exc)) from None
    if as_json:
        click.echo(dumps(stats))
        return
    cast = sum(x.params for x in stats.layers if x.source_dtype != "bfloat16")
    click.echo(f"wrote {out_dir}: {len(stats.layers)} weights, {stats.params} params, "
               f"{stats.bits_per_param:.4f} bits/param, {stats.exceptions} exceptions "
               f"({stats.exception_rate:.2e})")
    if cast:
        click.echo(f"note: {cast} params were not bf16 and were rounded to bf16")


@w12_group.command("stats")
@click.argument("model")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--top", type=click.IntRange(min=1), default=None,
              help="show only the N layers with most exceptions")
def stats_cmd(model, as_json, top):
    """Bits per parameter, exception rate and a per-layer table of MODEL: a W12 folder, a
    safetensors folder (encoded on the fly, bf16-cast) or 'embedded'."""
    # lazy: CLI startup time (kernels.w12 and stock.weights import torch)
    from kernels.w12.format import W12Error
    from kernels.w12.store import dumps, model_stats

    try:
        stats = model_stats(_model_folder(model))
    except W12Error as exc:
        raise SpecPilotError(str(exc)) from None
    if as_json:
        click.echo(dumps(stats))
        return
    from rich.console import Console
    from rich.table import Table

    layers = stats.layers
    if top:
        layers = sorted(layers, key=lambda x: -x.exception_rate)[:top]
    table = Table(title=f"W12 {stats.model}" + (" (stored)" if stats.stored_w12 else
                                                 " (encoded on the fly)"))
    for col in ("layer", "shape", "bits/param", "exceptions", "exc. rate", "source"):
        table.add_column(col, justify="left" if col in ("layer", "source") else "right")
    for x in layers:
        table.add_row(x.name, "x".join(map(str, x.shape)), f"{x.bits_per_param:.4f}",
                      str(x.exceptions), f"{x.exception_rate:.2e}", x.source_dtype)
    console = Console(width=140)
    console.print(table)
    console.print(f"total: {len(stats.layers)} weights, {stats.params} params, "
                  f"{stats.bytes} bytes (bf16: {stats.bytes_bf16}), "
                  f"{stats.bits_per_param:.4f} bits/param, exception rate "
                  f"{stats.exception_rate:.2e}")


def register(cli: click.Group) -> None:
    cli.add_command(w12_group)
