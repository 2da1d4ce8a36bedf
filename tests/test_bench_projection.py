"""bench/batch_projection.py's time to first token on the big target: a request's first
token costed as the forwards the batched engine made before emitting it (tiny random
target, fp32, CPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

bp = pytest.importorskip("batch_projection")

from stock.config import PRESETS  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.model import Transformer  # noqa: E402
from stock.options import Options  # noqa: E402
from stock.system import batch_engine  # noqa: E402


def test_projected_ttft_sums_the_forwards_before_each_first_token():
    order = [(2, 12, 12), (2, 1, 13), (2, 12, 12), (2, 1, 13)]
    cost = {(2, 12, 12): 0.5, (2, 1, 13): 0.1}
    # two requests out after the first prefill, one after the second, one never
    first = [[1, 0.0], [1, 0.0], [3, 0.0], None]
    assert bp.projected_ttft(order, first, cost) == pytest.approx([0.5, 0.5, 1.1])
    assert bp.ms([0.5, 0.5, 1.1], 50) == "500" and bp.ms([0.5, 0.5, 1.1], 100) == "1100"
    assert bp.ms([], 50) == ""


def test_the_recorder_sees_every_request_first_token_after_its_prefill():
    """2C requests at C = 2 on the batched engine: the first two get their first token
    right after the forward that prefilled them, the other two after a later prefill (they
    wait for free rows), and every forward before a first token is one the run made."""
    torch.manual_seed(0)
    model = Transformer.random(PRESETS["tiny-qwen3"], torch.device("cpu"), torch.float32, seed=0)
    gen = torch.Generator().manual_seed(1)
    reqs = [(torch.randint(1, model.cfg.vocab_size, (12,), generator=gen).tolist(), 4)
            for _ in range(4)]
    eng = batch_engine(Engine(model, Options(), 64, set()), None, 2)
    rec = bp.Shapes(eng)
    res = bp.run(eng, reqs, rec)
    first = res["first"]
    assert all(f is not None for f in first) and res["tokens"] == 4 * 4
    assert first[0][0] == first[1][0] == 1 and rec.order[0] == (2, 12, 12)
    assert first[2][0] == first[3][0] > 1 and rec.order[first[2][0] - 1][1] == 12
    assert sum(rec.seen.values()) == len(rec.order)
