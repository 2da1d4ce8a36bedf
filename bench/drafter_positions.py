"""Where the block drafter's blocks fail: per category, the hit rate at each draft depth, and
the engine's τ beside the τ the training validation computes (training.loop.walk_tau) and
the mean block acc-len over every anchor (the metric that overstates τ).

For each request: the AR output, the engine's speculative decode with the weights (τ =
tokens gained per verification step), then every answer column's block scored by teacher
forcing on the AR output (training.loop.anchor_runs: the leading run of top-1 hits, draft
length block_size - 1) and walked as decoding walks it. Depth d's rate is P(draft token d
right | tokens 1..d-1 right) over every anchor. CPU fp32 gives walk τ = engine τ up to the
last step of answers that end at a stop token (the engine's last step may accept drafts past
it).

    python bench/drafter_positions.py --per-category 4 --max-new 128       # CPU, ~4 min
    python bench/drafter_positions.py --weights DIR --sets dev,heldout
    python bench/drafter_positions.py --sets dev --draft-lens 7,8,15   # walk τ at each cap
    python bench/drafter_positions.py --smoke

`--draft-lens` adds the walk τ the engine would get drafting at most k tokens a step (each
anchor's run capped at k, then walked): one teacher-forced pass answers every draft_len.

Prints one table; writes drafter_positions.json to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import os
import statistics

from common import log, print_table, smoke_device, write_json  # noqa: E402 - sets sys.path first

import torch  # noqa: E402

from drafter_tau import HELDOUT_SEED, answer_runs, request_set, weights_label  # noqa: E402
from specpilot.requests import CATEGORIES  # noqa: E402
from stock.drafters.block_weights import load_block  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.options import Options  # noqa: E402
from stock.system import load_system, make_drafter  # noqa: E402
from training.loop import depth_rates, walk  # noqa: E402

DEPTHS = 4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="shipped", help="a block-drafter folder ('shipped')")
    ap.add_argument("--sets", default="dev")
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--draft-lens", default="",
                    help="comma-separated caps k: the walk τ of draft_len k beside the table")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU: the first 2 dev requests (two categories), 8 tokens")
    args = ap.parse_args()
    if args.smoke:
        args.per_category, args.max_new = 1, 8
        args.draft_lens = args.draft_lens or "1,15"
    args.device = smoke_device(args)
    caps = [int(x) for x in args.draft_lens.split(",") if x]
    label, folder = weights_label(args.weights)
    system = load_system("embedded", Options(), device=args.device, max_context=4096)
    tok, model = system.tokenizer, system.engine.model
    net, _ = load_block(folder, model)
    net = net.to(model.device, model.dtype).eval()
    k = net.cfg.block_size - 1
    engine = Engine(model, Options({"block_size": net.cfg.block_size, "draft_len": k,
                                    "block_weights": str(folder)}), 4096,
                    set(system.engine.stop_ids))
    drafter = make_drafter("block", engine)
    rows, result = [], {"weights": label, "device": args.device, "sets": {}}
    for set_name in [s for s in args.sets.split(",") if s]:
        per: dict[str, dict] = {}
        reqs = request_set(set_name, args.per_category, HELDOUT_SEED)
        if args.smoke:   # two categories (code, chat) summed into "all": CI time kept
            reqs = reqs[:2]
        for i, r in enumerate(reqs):
            prompt = tok.chat(r.prompt)
            max_new = min(args.max_new, r.max_new_tokens)
            ans = system.engine.generate(prompt, max_new).tokens
            res = engine.generate(prompt, max_new, drafter)
            if len(ans) < 2:
                continue
            runs = answer_runs(net, model, prompt, ans, k)
            c = per.setdefault(r.category, {"engine": [], "walk": [], "runs": [], "each": []})
            c["engine"] += res.accepted
            c["walk"] += walk(runs)
            c["runs"] += runs.tolist()
            c["each"].append(runs)
            log(f"{set_name} {i + 1} {r.id}: engine τ {statistics.mean(res.accepted):.2f}, "
                f"walk τ {statistics.mean(walk(runs)):.2f}, outputs equal: {res.tokens == ans}")
        out = {}
        cats = [c for c in CATEGORIES if c in per]
        for cat in cats + ["all"]:
            group = [per[c] for c in cats] if cat == "all" else [per[cat]]
            eng = [x for g in group for x in g["engine"]]
            wlk = [x for g in group for x in g["walk"]]
            runs = torch.tensor([x for g in group for x in g["runs"]])
            rate = depth_rates([runs], DEPTHS)
            capped = {k: statistics.mean([x for g in group for r in g["each"]
                                          for x in walk(r.clamp(max=k))]) for k in caps}
            out[cat] = {"engine_tau": statistics.mean(eng), "walk_tau": statistics.mean(wlk),
                        "uniform_acc_len": float(runs.float().mean() + 1), "depth_rates": rate,
                        "anchors": len(runs), "walk_tau_at": capped}
            if k in capped and capped[k] != out[cat]["walk_tau"]:   # no cap: the walk itself
                raise SystemExit(f"{set_name} {cat}: walk τ at draft_len {k} "
                                 f"{capped[k]} != walk τ {out[cat]['walk_tau']}")
            rows.append([set_name, cat, len(runs), f"{out[cat]['engine_tau']:.2f}",
                         f"{out[cat]['walk_tau']:.2f}", f"{out[cat]['uniform_acc_len']:.2f}"]
                        + [f"{x:.2f}" for x in rate] + [f"{capped[k]:.2f}" for k in caps])
        result["sets"][set_name] = out
    write_json(args.out, "drafter_positions.json", result)
    print_table(["set", "category", "anchors", "engine τ", "walk τ", "acc-len, every anchor"]
                + [f"depth {d}" for d in range(1, DEPTHS + 1)]
                + [f"walk τ, draft_len {k}" for k in caps], rows,
                f"block drafter {label}: depth d = P(draft token d right, given 1..d-1 right) "
                f"over every anchor; {args.device}, {args.max_new} new tokens at most")


if __name__ == "__main__":
    main()
