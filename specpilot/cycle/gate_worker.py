"""Runs the judges' gates (specpilot/judges/forcing.py, the project's own code) on a candidate's
clean checkout, in its own process.

Started as `python -P -B -s gate_worker.py JOB.json OUT.json` with PYTHONPATH=<checkout>:<the
project's package root>: `import stock` is the candidate's checkout (first on the path, and
checked), `import specpilot` is the project's. The references arrive precomputed by the
project's stock in JOB.json; the candidate never computes its own reference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from specpilot.cycle.worker_job import read_job

    job = read_job(argv)
    import torch

    from specpilot.config import GatesSection
    from specpilot.judges.forcing import Reference, forcing_gate, option_default_gate
    import stock.system  # noqa: F401 - registers every option the system defines
    from stock.engine import Engine
    from stock.options import Options

    torch.manual_seed(0)
    refs = [Reference.model_validate(r) for r in job["references"]]
    cfg = GatesSection.model_validate(job["gates"])
    model = job["model"]
    ctx = job["max_context"]
    if model.startswith("random:"):
        from stock.config import PRESETS
        from stock.model import Transformer

        net = Transformer.random(PRESETS[model[7:]], seed=job.get("seed", 0))
        stops: set = set()
    else:
        from stock.system import load_system

        system = load_system(model, Options(), "cpu" if not torch.cuda.is_available() else None,
                             ctx)
        net, stops = system.engine.model, system.engine.stop_ids
    reports = []
    if job.get("default_gate"):
        engine = Engine(net, Options(), ctx, stops)
        reports.append(option_default_gate(engine, refs, cfg, drafter=job["drafter"],
                                           check=job["check"]))
    if job.get("forcing_gate"):
        engine = Engine(net, Options(job["options"]), ctx, stops)
        reports.append(forcing_gate(engine, refs, cfg, exact=False, check=job["check"]))
    out = [r.model_dump(mode="json") for r in reports]
    from stock.options import REGISTRY   # the candidate's own option definitions

    specs = {n: {"type": o.type.__name__, "default": o.default, "help": o.help}
             for n, o in REGISTRY.items() if n in job["options"]}
    for r in out:
        r["option_specs"] = specs
    Path(argv[2]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
