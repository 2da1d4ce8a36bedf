"""The start of every cycle worker run on a clean checkout (gate_worker, system_worker)."""

from __future__ import annotations

import json
from pathlib import Path


def read_job(argv: list[str]) -> dict:
    """The job in JSON file argv[1]; exits unless `import stock` is the job's checkout (the
    checkout is first on PYTHONPATH, the project's package root after it)."""
    job = json.loads(Path(argv[1]).read_text())
    import stock

    checkout = Path(job["checkout"]).resolve()
    where = Path(stock.__file__).resolve()
    if checkout not in where.parents:
        raise SystemExit(f"stock imported from {where}, not from the checkout {checkout}")
    return job
