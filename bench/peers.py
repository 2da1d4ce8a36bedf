"""Peers on the same weights: stock's AR decode against transformers' generate().

One random-weight target of a preset (default `dense-27b`, bf16 on CUDA, seed 0, as the
controller's workers build it) and one random prompt of --prompt-len tokens. Systems, each
greedy, every new token forced (no stop token):

- `stock AR`: stock's engine at its defaults (on CUDA: static step replayed from CUDA
  graphs, compiled layers, fused projections);
- `transformers, static cache, compiled`: the same tensors (shared, not copied) in
  transformers' model class of the architecture, `generate(cache_implementation="static")`,
  which on CUDA compiles the decoding forward (transformers' auto-compile; off CUDA it runs
  eager and the row says so);
- `transformers, dynamic cache, eager`: plain `generate()`.

Per system and round: the wall time of generate(N) and of generate(1) (prefill and first
token), each synchronised; a decoding token costs (t_N - t_1) / (N - 1), the same method for
every system. The first untimed calls compile, capture and size the caches (transformers
keeps a static cache's length across calls, so generate(1) after generate(N) does not
recompile). Beside it: the weight-bytes floor (every parameter byte but the embedding table
read once a token, at the measured copy bandwidth) and where each peer's greedy tokens first
leave stock's (bf16 summation order differs between the two implementations, so a random
target's near-ties may flip).

    python3 bench/peers.py                                  # H200, dense-27b, 64 tokens
    python3 bench/peers.py --preset smollm2-135m --max-new 128 --rounds 7
    python3 bench/peers.py --smoke                          # CPU: tiny-qwen3, fp32, 6 tokens

Prints one table; writes peers.json to --out.
"""

from __future__ import annotations

import argparse
import os
import time

from common import GiB, copy_bandwidth, first_divergence, log, print_table, quantile, \
    smoke_device, sync, write_json

import torch  # noqa: E402


def hf_model(net):
    """transformers' model of net's architecture holding net's own tensors (assigned, not
    copied): built on the meta device, the state dict assigned, the rotary embedding (its
    only non-persistent buffer) rebuilt on the device, embeddings tied as configured."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = net.cfg.to_hf()
    cfg["torch_dtype"] = str(net.dtype).removeprefix("torch.")
    hcfg = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    hcfg.eos_token_id = None
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(hcfg, dtype=net.dtype)
    state = {k: v for k, v in net.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False, assign=True)
    if net.cfg.tie_embeddings:
        hf.tie_weights()
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing[:4]}, unexpected {unexpected[:4]}")
    with torch.device(net.device):  # the inv_freq buffers made on the device
        hf.model.rotary_emb = type(hf.model.rotary_emb)(config=hcfg)
    meta = [n for n, t in [*hf.named_parameters(), *hf.named_buffers()] if t.is_meta]
    if meta:
        raise RuntimeError(f"left on the meta device: {meta[:4]}")
    shared = hf.model.layers[0].mlp.down_proj.weight.data_ptr() == \
        net.model.layers[0].mlp.down_proj.weight.data_ptr()
    return hf.eval(), shared


def weight_bytes(net) -> int:
    embed = net.model.embed_tokens.weight
    seen, total = {embed.data_ptr()}, 0
    for t in [*net.parameters(), *net.buffers()]:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="dense-27b")
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-dynamic", action="store_true", help="skip transformers' dynamic cache")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--smoke", action="store_true",
                    help="CPU plumbing check: tiny-qwen3, fp32, 6 tokens, 2 rounds")
    args = ap.parse_args()
    if args.smoke:
        args.preset, args.max_new, args.rounds, args.prompt_len = "tiny-qwen3", 6, 2, 8
    dev = smoke_device(args)
    from stock.config import PRESETS
    from stock.engine import Engine
    from stock.model import Transformer
    from stock.options import Options

    cuda = dev.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    net = Transformer.random(PRESETS[args.preset], torch.device(dev), dtype, seed=0)
    n, ctx = args.max_new, args.prompt_len + args.max_new + 64
    eng = Engine(net, Options(), ctx, set())   # builds stock's step (fuses projections: views)
    log(f"{args.preset} built on {dev} ({dtype}); stock engine: graphs {eng.uses_graphs}, "
        f"compiled {eng.compiled}")
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, net.cfg.vocab_size, (args.prompt_len,), generator=g).tolist()

    def ours(k: int):
        return eng.generate(prompt, k).tokens

    hf, shared = hf_model(net)
    log(f"transformers {type(hf).__name__} on the same tensors (shared storage: {shared})")
    ids = torch.tensor([prompt], device=dev)

    def hf_run(static: bool):
        kw = {"cache_implementation": "static"} if static else {}

        def run(k: int):
            with torch.inference_mode():
                out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=k,
                                  min_new_tokens=k, do_sample=False, pad_token_id=0,
                                  eos_token_id=None, **kw)
            return out[0, len(prompt):].tolist()
        return run

    systems = {"stock AR": ours,
               "transformers, static cache, " + ("compiled" if cuda else "eager (no compile off CUDA)"):
                   hf_run(True)}
    if not args.no_dynamic:
        systems["transformers, dynamic cache, eager"] = hf_run(False)
    tokens, per = {}, {name: [] for name in systems}
    for name, fn in systems.items():   # untimed: compiles, captures, sizes the caches
        t0 = time.perf_counter()
        tokens[name] = fn(n)
        fn(1)
        sync(dev)
        log(f"{name}: warm-up {time.perf_counter() - t0:.1f} s, {len(tokens[name])} tokens")
    for r in range(args.rounds):
        for name, fn in systems.items():
            t0 = time.perf_counter()
            fn(n)
            sync(dev)
            tn = time.perf_counter() - t0
            t0 = time.perf_counter()
            fn(1)
            sync(dev)
            t1 = time.perf_counter() - t0
            per[name].append(1e3 * (tn - t1) / max(n - 1, 1))
        log(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.3f} ms" for k, v in per.items()))
    bw = None
    if cuda:
        try:
            bw = copy_bandwidth(GiB, dev)["read_plus_write_bytes_per_s"]
        except Exception as exc:  # noqa: BLE001 - the table stands without the floor
            log(f"copy bandwidth failed: {exc!r}")
    else:
        bw = copy_bandwidth(16 << 20, dev)["read_plus_write_bytes_per_s"]
    wb = weight_bytes(net)
    floor = 1e3 * wb / bw if bw else None
    ref = sorted(per["stock AR"])[len(per["stock AR"]) // 2]
    rows, report = [], {"preset": args.preset, "device": dev, "dtype": str(dtype),
                        "prompt_len": args.prompt_len, "max_new": n, "rounds": args.rounds,
                        "shared_storage": shared, "weight_bytes": wb,
                        "copy_bytes_per_s": bw, "floor_ms": floor, "systems": {}}
    for name, ms in per.items():
        med = sorted(ms)[len(ms) // 2]
        div = first_divergence(tokens["stock AR"], tokens[name])
        report["systems"][name] = {"ms_per_token": ms, "median_ms": med, "first_divergence": div}
        rows.append([name, f"{med:.3f}", f"{quantile(ms, .1):.3f}-{quantile(ms, .9):.3f}",
                     f"{med / ref:.3f}", f"{med / floor:.3f}" if floor else "",
                     "=" if div is None else f"at token {div}"])
    if floor:
        rows.append(["weight-bytes floor", f"{floor:.3f}", "", f"{floor / ref:.3f}", "1.000", ""])
    write_json(args.out, "peers.json", report)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"\n{name}  torch {torch.__version__}  {args.preset} random weights ({dtype}), "
          f"{args.prompt_len}-token prompt, {n} new tokens, {args.rounds} rounds; weight bytes "
          f"{wb / 1e9:.2f} GB (embedding table excluded)"
          + (f", copy {bw / 1e12:.3f} TB/s (read + write)" if bw else ""))
    print_table(["system", "ms a decoding token (median)", "p10-p90", "x stock AR", "x floor",
                 "greedy tokens vs stock's"], rows)


if __name__ == "__main__":
    main()
