"""Measures one system (a clean checkout of its commit, at its options) for the cycle, in
its own process: Phase 0's cost-model report (`specpilot.judges.analyze`) and the tuner's timings
(`agents/tune.halving`).

Started as `python -P -B -s system_worker.py JOB.json OUT.json` with PYTHONPATH=<checkout>:
<the project's package root>: `import stock` is the system's checkout (first on the path,
and checked), `import specpilot` is the project's, so the judges' code is never the
system's. Requests arrive in JOB.json from the project's own copy (prompts.pick_requests).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path


def _load(job: dict):
    """A stock.system.System for the job's model at the job's options, and prompts as
    (id, token ids)."""
    import torch
    from stock.engine import Engine
    from stock.options import Options
    from stock.system import System, load_system

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, options, ctx = job["model"], Options(job["options"]), job["max_context"]
    if model.startswith("random:"):
        from stock.config import PRESETS
        from stock.model import Transformer

        net = Transformer.random(PRESETS[model[7:]], seed=job.get("seed", 0))
        system = System(Engine(net, options, min(ctx, net.cfg.max_position), set()), None,
                        Path("."), device)
    else:
        system = load_system(model, options, str(device), ctx)
    prompts = [(rid, ids if ids is not None else system.tokenizer.chat(prompt)[-1024:])
               for rid, prompt, ids in job["requests"]]
    return system, prompts


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def run_analyze(job: dict) -> dict:
    from specpilot.judges.analyze import analyze

    system, prompts = _load(job)
    rep = analyze(Path(job["cache_root"]), job["model"], None, len(prompts), job["max_new"],
                  job["drafter"], system=system, prompts=prompts)
    out = _finite(rep.model_dump(mode="python"))
    out["registered_options"] = registered_options()
    return out


def registered_options() -> dict:
    """The system's own option registry (names, types, defaults, choices, help, and the
    device types an option acts on, None for all; a system older than that field has none)."""
    from stock.options import REGISTRY

    return {n: {"type": o.type.__name__, "default": o.default, "help": o.help,
                "choices": list(o.choices) if getattr(o, "choices", None) else None,
                "devices": list(o.devices) if getattr(o, "devices", None) else None}
            for n, o in REGISTRY.items()}


def run_tune(job: dict) -> dict:
    from stock.engine import Engine
    from stock.options import Options

    from specpilot.agents.tune import halving

    system, prompts = _load(job)
    e = system.engine
    lines: list[str] = []

    def timed(options: dict, i: int) -> float:
        engine = Engine(e.model, Options(options), e.max_context, e.stop_ids)
        ids = prompts[i % len(prompts)][1]
        return engine.generate(ids, job["max_new"], system.drafter(job["drafter"])).decode_s

    # warm-up, not counted: on CUDA every prompt once, so that no timed call pays the first
    # compile of a T bucket (stock's `compile` option: seconds a T) for the others
    for i in range(len(prompts) if e.uses_graphs else 1):
        timed(job["options"], i)
    res = halving(job["configs"], job["options"], timed, lines.append)
    res["log"] = lines
    return res


def main(argv: list[str]) -> int:
    from specpilot.cycle.worker_job import read_job

    job = read_job(argv)
    import torch

    torch.manual_seed(0)
    t0 = time.perf_counter()
    out = {"analyze": run_analyze, "tune": run_tune}[job["task"]](job)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    Path(argv[2]).write_text(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
