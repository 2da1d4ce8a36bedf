"""Assemble the stock system: model, tokenizer, engine and drafter from names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from stock.compiled import compile_enabled
from stock.devices import check_context, check_device
from stock.drafters.base import Drafter
from stock.drafters.block import BlockDrafter, BlockDrafterError
from stock.drafters.draft_model import DraftModelDrafter
from stock.drafters.ngram import NGramDrafter
from stock.engine import Engine
from stock.errors import StockError
from stock.model import Transformer
from stock.options import Options
from stock.tokenizer import Tokenizer
from stock.weights import resolve

DRAFTERS = ("ngram", "draft", "block")


@dataclass
class System:
    engine: Engine
    tokenizer: Tokenizer
    folder: Path
    device: torch.device

    @property
    def options(self) -> Options:
        return self.engine.options

    def drafter(self, name: str | None) -> Drafter | None:
        return make_drafter(name, self.engine)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_system(model: str = "embedded", options: Options | None = None, device: str | None = None,
                max_context: int | None = None) -> System:
    """fp32 on CPU, bf16 on CUDA (logits are fp32 either way). A device that does not
    exist here or a context below one token is a StockError naming it."""
    device, max_context = check_device(device), check_context(max_context)
    dev = torch.device(device) if device else default_device()
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    folder = resolve(model)
    net = Transformer.from_folder(folder, dev, dtype)
    tok = Tokenizer(folder)
    ctx = min(max_context or net.cfg.max_position, net.cfg.max_position)
    stops = set(tok.stop_ids) | set(net.cfg.eos_token_ids)
    return System(Engine(net, options, ctx, stops), tok, folder, dev)


def make_drafter(name: str | None, engine: Engine, net=None) -> Drafter | None:
    """`name`: one of DRAFTERS, "ar" / "none" / None (no drafter), or "auto": the block
    drafter where its weights (option block_weights, default the shipped ones) were trained
    for this target, else the n-gram drafter."""
    opts = engine.options
    if name in (None, "", "none", "ar"):
        return None
    if name == "auto":
        if "block" in engine.drafters:
            return engine.drafters["block"]
        name, net = resolve_auto(engine)
        return make_drafter(name, engine, net)
    if name == "ngram":
        return NGramDrafter(opts["ngram_max"], opts["ngram_min"], opts["lattice_topk"])
    if name == "draft":
        layers = opts["draft_layers"]
        if not 1 <= layers <= engine.model.cfg.num_layers:
            raise StockError(f"draft_layers must be in 1..{engine.model.cfg.num_layers}")
        return DraftModelDrafter(engine.model, engine.max_context, layers, opts["lattice_topk"])
    if name == "block":
        if "block" in engine.drafters:  # built once per engine: weights, CUDA graphs
            return engine.drafters["block"]
        net = net if net is not None else block_net(engine)
        cuda = engine.model.device.type == "cuda"
        # option compile: the drafter's step regions too (stock/drafters/block_step.py)
        drafter = engine.drafters["block"] = BlockDrafter(
            net, engine.model, engine.max_context, opts["block_topk"],
            graphs=opts["block_graphs"] and cuda,
            compiled=compile_enabled(opts, engine.model.device) and opts["block_compile"])
        return drafter
    raise StockError(f"unknown drafter {name!r}; known: {', '.join(DRAFTERS)}, auto, ar")


def resolve_auto(engine: Engine):
    """The drafter "auto" names, as both engines resolve it: ("block", its net) where the
    block drafter's weights (option block_weights, default the shipped ones) were trained for
    this target, else ("ngram", None)."""
    try:
        return "block", block_net(engine)
    except BlockDrafterError:
        return "ngram", None


def block_net(engine: Engine):
    """The block drafter's weights as the options name them, at the options' block size."""
    from stock.drafters.block_weights import load_block  # lazy: only for block

    opts = engine.options
    net, manifest = load_block(opts["block_weights"] or None, engine.model)
    if opts["block_size"] != manifest.config.block_size:
        net = net.resized(opts["block_size"])
    return net


def batch_engine(engine: Engine, drafter: str | None, max_batch: int, net=None, **kw):
    """A BatchEngine over `engine`'s model, options, context and stop ids, speculating with
    `drafter`: the block drafter batched (one forward for every row's block), the others
    one per request. `net`: the block drafter's BlockNet (default: the weights option
    block_weights names, checked against the target; a benchmark on random weights passes a
    random one)."""
    from stock.batch import BatchEngine  # lazy: the serving and throughput paths only
    from stock.drafters.block_batch import BatchBlockDrafter

    args = dict(max_batch=max_batch, max_context=engine.max_context, stop_ids=engine.stop_ids)
    if drafter == "auto":   # as make_drafter resolves it, so that the block drafter is batched
        drafter, net = resolve_auto(engine)
    if drafter == "block":
        opts = engine.options
        static = engine.model.device.type == "cuda" and opts["cuda_graphs"]
        compiled = static and compile_enabled(opts, engine.model.device)
        bd = BatchBlockDrafter(net if net is not None else block_net(engine), engine.model,
                               engine.max_context, rows=max_batch + 1, topk=opts["block_topk"],
                               static=static, compiled=compiled and opts["block_compile"],
                               chain_len=opts["draft_len"],
                               attention=opts["attention_kernel"] if compiled else "sdpa")
        return _named(BatchEngine(engine.model, engine.options, batch_drafter=bd, **args, **kw),
                      "block")
    make_drafter(drafter, engine)   # an unknown name fails here, before any request
    return _named(BatchEngine(engine.model, engine.options, **args, **kw,
                              drafter_factory=lambda: make_drafter(drafter, engine)),
                  "ar" if drafter in (None, "", "none", "ar") else drafter)


def _named(batch, drafter: str):
    """`batch` with `drafter_name`, the drafter it speculates with ("auto" resolved; "ar"
    for none): what a server shows and a confined worker reports."""
    batch.drafter_name = drafter
    return batch
