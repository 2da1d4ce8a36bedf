"""Block-drafter weights side by side: τ per category on the dev requests and on held-out
requests, with every speculative output checked against AR (issue 24's table).

Held-out requests come from the sealed generator's templates (specpilot/requests/sealed.py)
drawn with a public seed (--heldout-seed): drafter training excludes those templates and
the dev prompts (training/prompts.py), so their τ is what the weights do on prompts of kinds
they never saw. (The sealed set itself is drawn with a secret seed kept outside the
repository; this set shares its templates, not its draws.) The corpus set is the other
side: prompts of the training corpus itself (training/prompts.py, --corpus-seed, the wide
corpus), per source, such as the drafter trained on: the gap between its τ and the dev
requests' is how far the corpus is from the requests.

For each request: the AR output once, then one speculative decode per weights folder (block
drafter, draft_len = block_size - 1: "block 16"), τ = tokens gained per verification step,
bonus included. τ is hardware-independent; on the CPU (fp32) every speculative output must
equal AR's token for token, and the table counts those that do.

    python bench/drafter_tau.py --weights shipped,/path/to/new --per-category 4 --max-new 128
    python bench/drafter_tau.py --sets heldout --per-category 8       # the shipped weights
    python bench/drafter_tau.py --sets dev,corpus --per-category 4    # requests against corpus
    python bench/drafter_tau.py --sets dev --draft-len 7                # 7 drafts of a block of 16
    python bench/drafter_tau.py --sets dev --draft-len 7 --weights shipped,shipped@block_size=8
                                          # side by side: blocks of 16 and of 8, 7 drafts each
    python bench/drafter_tau.py --smoke        # CPU: shipped twice, 2 dev requests, 1 a set else
    python bench/drafter_tau.py --walk --per-category 1000 --sets dev   # every dev request
    python bench/drafter_tau.py --walk --sets dev --weights shipped@draft_len=3,shipped@draft_len=7
                                          # τ against draft_len: one scoring, walked at each cap

`--walk` computes each column's τ without decoding: every block of the AR output scored by
teacher forcing (training.loop.anchor_runs) and walked as decoding walks it
(training.loop.walk; equal to the engine's τ to two decimals on all 40 dev and held-out
requests, bench/drafter_positions.py). One AR decode a request and one teacher-forced pass a
column, several times faster than a speculative decode a column: enough for the whole dev
set. Its "= AR" column reads "walk" (nothing was decoded to compare); columns may cap
draft_len after '@', not change block_size; columns of the same weights share one scoring.

Prints one table; writes drafter_tau.json to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from common import log, print_table, smoke_device, write_json  # noqa: E402 - sets sys.path first

import torch  # noqa: E402

from specpilot.requests import CATEGORIES, load_dev, select  # noqa: E402
from specpilot.requests.sealed import generate_sealed  # noqa: E402
from stock.drafters.block_weights import DEFAULT_DIR, read_manifest  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.options import Options  # noqa: E402
from stock.system import load_system, make_drafter  # noqa: E402
from training.data import Data  # noqa: E402
from training.loop import LiveFeatures, anchor_runs, walk  # noqa: E402

HELDOUT_SEED = 20261204


@dataclass(frozen=True)
class CorpusPrompt:
    id: str
    category: str   # the corpus source (training/prompts.py MIX)
    prompt: str
    max_new_tokens: int = 192   # the answers' length in training (--max-new 192)


def corpus_set(per_source: int, seed: int) -> list[CorpusPrompt]:
    """`per_source` prompts of each source of the wide training corpus drawn from `seed`,
    dev prompts excluded as training excludes them."""
    from training.prompts import build_prompts, dev_prompts

    pairs = build_prompts(seed, 200 * per_source, exclude=dev_prompts(), limit_files=20,
                          corpus="wide")
    out: list[CorpusPrompt] = []
    for src in dict.fromkeys(c for c, _ in pairs):
        mine = [t for c, t in pairs if c == src][:per_source]
        out += [CorpusPrompt(f"corpus-{src}-{i + 1:03d}", src, t) for i, t in enumerate(mine)]
    return out


def request_set(name: str, per_category: int, seed: int, corpus_seed: int = 0):
    if name == "dev":
        return select(load_dev(), None, per_category)
    if name == "heldout":
        drawn = generate_sealed(seed, per_category * len(CATEGORIES))
        return [r for c in CATEGORIES for r in drawn if r.category == c]   # balanced: n each
    if name == "corpus":
        return corpus_set(per_category, corpus_seed)
    raise SystemExit(f"drafter_tau: unknown request set {name!r} (dev, heldout, corpus)")


def column(spec: str, block_size: int, draft_len: int) -> tuple[str, Path, dict]:
    """One column of the table: "FOLDER" or "FOLDER@block_size=8+draft_len=7" (the weights,
    then stock options of this column only) -> (label, folder, the engine's options)."""
    folder, _, rest = spec.partition("@")
    given: dict[str, int] = {}
    for kv in filter(None, rest.split("+")):
        key, sep, val = kv.partition("=")
        if key not in ("block_size", "draft_len") or not sep or not val.isdigit():
            raise SystemExit(f"drafter_tau: {spec!r}: options after '@' are block_size=N, "
                             "draft_len=N joined by '+'")
        given[key] = int(val)
    size = given.get("block_size", block_size)   # a smaller block caps the drafts it holds
    opts = {"block_size": size, "draft_len": given.get(
        "draft_len", min(draft_len, size - 1) if "block_size" in given else draft_len)}
    if not 1 <= opts["draft_len"] <= opts["block_size"] - 1:
        raise SystemExit(f"drafter_tau: {spec!r}: draft_len must be in 1..block_size - 1")
    label, path = weights_label(folder)
    return (label + (f" @{rest}" if rest else "")), path, opts


def weights_label(folder: str) -> tuple[str, Path]:
    path = DEFAULT_DIR if folder in ("", "shipped") else Path(folder)
    if not (path / "manifest.json").is_file():
        raise SystemExit(f"drafter_tau: {path}: no manifest.json (a block-drafter folder?)")
    man = read_manifest(path)
    runs = len(getattr(man, "history", None) or []) + 1
    label = "shipped" if path == DEFAULT_DIR else path.name
    return f"{label} (steps {man.training.get('steps')}, runs {runs})", path


def decoder(engine: Engine, drafter):
    """gain(prompt, AR tokens, max_new) -> (tokens gained a step, output == AR): one
    speculative decode."""
    def gain(prompt, want, max_new):
        res = engine.generate(prompt, max_new, drafter)
        return res.accepted, res.tokens == want
    return gain


def answer_runs(net, model, prompt: list[int], answer: list[int], draft_len: int):
    """Every block of one answer scored by teacher forcing (training.loop.anchor_runs): the
    leading run of top-1 hits at each answer column, at most draft_len."""
    data = Data(tokens=torch.tensor([prompt + answer]), pad=torch.tensor([0]),
                end=torch.tensor([len(prompt) + len(answer)]), prompt_cols=len(prompt))
    feats = LiveFeatures(model, data, tuple(net.cfg.target_layers))
    return anchor_runs(net, model, data, feats, torch.tensor([0]), draft_len, 1, 64,
                       torch.autocast(model.device.type, enabled=False))[0]


def walkers(model, columns, drafters) -> list:
    """The same from the AR output alone: its blocks scored by teacher forcing and walked
    (training.loop), no decoding; "equal" is not known (False). Columns of the same weights
    and block size share one scoring at their largest draft_len, each walking the runs
    capped at its own (a run scored at d is the run scored at more, capped at d)."""
    reach: dict = {}
    for (_l, path, o) in columns:
        key = (path, o["block_size"])
        reach[key] = max(reach.get(key, 0), o["draft_len"])
    last: dict = {}   # key -> (the answer scored, its runs): the request being walked

    def walker(key, net, draft_len):
        def gain(prompt, want, max_new):
            if len(want) < 2:
                return [], False
            if key not in last or last[key][0] != (prompt, want):
                last[key] = ((prompt, want), answer_runs(net, model, prompt, want, reach[key]))
            return walk(last[key][1].clamp(max=draft_len)), False
        return gain
    return [walker((p, o["block_size"]), d.net, o["draft_len"])
            for (_l, p, o), d in zip(columns, drafters)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="shipped",
                    help="block-drafter folders, comma-separated ('shipped': the shipped one), "
                         "each with its own options after '@' (shipped@block_size=8)")
    ap.add_argument("--sets", default="dev,heldout")
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16,
                    help="positions a drafter forward computes (weights trained at 16 drafted "
                         "in blocks of another size: stock option block_size)")
    ap.add_argument("--draft-len", type=int, default=None,
                    help="drafts verified a step (default block size - 1)")
    ap.add_argument("--heldout-seed", type=int, default=HELDOUT_SEED)
    ap.add_argument("--corpus-seed", type=int, default=0,
                    help="the corpus set's draw (training/prompts.py build_prompts)")
    ap.add_argument("--walk", action="store_true",
                    help="τ by walking teacher-forced blocks of the AR output, no decoding")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--smoke", action="store_true",
                    help="CPU: shipped twice, 2 dev requests (two categories), 1 held-out "
                         "and 1 corpus request, 8 new tokens")
    args = ap.parse_args()
    if args.smoke:
        args.weights, args.per_category, args.max_new = "shipped,shipped", 1, 8
        args.sets = "dev,heldout,corpus"
    args.device = smoke_device(args)
    if args.draft_len is None:
        args.draft_len = args.block_size - 1
    if not 1 <= args.draft_len <= args.block_size - 1:
        ap.error(f"--draft-len must be in 1..{args.block_size - 1} (the block's masks)")
    specs = [w.strip() for w in args.weights.split(",") if w.strip() != ""] or ["shipped"]
    columns = [column(w, args.block_size, args.draft_len) for w in specs]
    labels = [(lab, p) for lab, p, _o in columns]
    if args.walk and any(o["block_size"] != args.block_size for _l, _p, o in columns):
        ap.error("--walk scores the blocks the weights draw (--block-size); a column may cap "
                 "draft_len after '@', not change block_size")
    system = load_system("embedded", Options(), device=args.device, max_context=4096)
    tok, model = system.tokenizer, system.engine.model
    engines = [Engine(model, Options({**o, "block_weights": str(p)}), 4096,
                      set(system.engine.stop_ids)) for _lab, p, o in columns]
    drafters = [make_drafter("block", e) for e in engines]
    gainers = (walkers(model, columns, drafters) if args.walk
               else [decoder(e, d) for e, d in zip(engines, drafters)])
    ar = system.engine
    result: dict = {"weights": [lab for lab, _ in labels], "sets": {}, "device": args.device}
    rows, t0 = [], time.perf_counter()
    for set_name in [s for s in args.sets.split(",") if s]:
        reqs = request_set(set_name, args.per_category, args.heldout_seed, args.corpus_seed)
        if args.smoke:   # every set's path, CI time kept: dev's two requests (two categories
            reqs = reqs[:2 if set_name == "dev" else 1]   # summed into "all"), one a set else
        per: dict[str, list] = {}   # category -> per weights folder: tokens gained a step
        same = [0] * len(labels)
        for i, r in enumerate(reqs):
            prompt = tok.chat(r.prompt)
            max_new = min(args.max_new, r.max_new_tokens)
            want = ar.generate(prompt, max_new).tokens
            cat = per.setdefault(r.category, [[] for _ in labels])
            taus = []
            for j, gain in enumerate(gainers):
                gained, equal = gain(prompt, want, max_new)
                cat[j].extend(gained)
                same[j] += equal
                taus.append(statistics.mean(gained) if gained else float("nan"))
            log(f"{set_name} {i + 1}/{len(reqs)} {r.id}: τ "
                + ", ".join(f"{t:.2f}" for t in taus) + f" ({time.perf_counter() - t0:.0f} s)")
        cats = [c for c in CATEGORIES if c in per] + [c for c in per if c not in CATEGORIES]
        out = {}
        for c in cats + ["all"]:
            gained = ([sum((per[k][j] for k in cats), []) for j in range(len(labels))]
                      if c == "all" else per[c])
            taus = [statistics.mean(g) if g else float("nan") for g in gained]
            out[c] = taus
            rows.append([set_name, c, sum(1 for x in reqs if c in ("all", x.category))]
                        + [f"{t:.2f}" for t in taus]
                        + ([f"{taus[-1] / taus[0]:.3f}"] if len(taus) > 1 else [])
                        + ([("walk" if args.walk else
                             ", ".join(f"{s}/{len(reqs)}" for s in same))] if c == "all"
                           else [""]))
        result["sets"][set_name] = {"tau": out, "requests": len(reqs),
                                    "identical_to_ar": None if args.walk else same}
        write_json(args.out, "drafter_tau.json", result)
    cols = (["set", "category", "requests"] + [f"τ {lab}" for lab, _ in labels]
            + (["last / first"] if len(labels) > 1 else []) + ["= AR"])
    print_table(cols, rows, ("walked " if args.walk else "")
                + f"block drafter τ (block {args.block_size}, draft_len "
                f"{args.draft_len} where a column's '@' does not say), {args.device}, "
                f"{args.max_new} new tokens at most; "
                f"held-out: sealed templates, seed {args.heldout_seed}")


if __name__ == "__main__":
    main()
