"""Memory entry two-level on CUDA: the first pass in CUDA-graph slots of its own (captured
with the 8-bit view on) gives the eager static path's tokens and accepted counts, bit for
bit, over chains and trees, and leaves every W12 linear on its exact planes. Runs where
the entry is applied, e.g. on the device: `source bench/stage.sh && stage_repo /tmp/repo
tl=two-level && cd /tmp/repo && git checkout -q tl && python3 -m pytest -q
tests/gpu/test_gpu_two_level.py`."""

from __future__ import annotations

import pytest
import torch

from stock.options import REGISTRY, Options

if "two_level" not in REGISTRY:
    pytest.skip("option two_level comes with the memory entry two-level", allow_module_level=True)

from stock.config import PRESETS  # noqa: E402
from stock.drafters.draft_model import DraftModelDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.model import Transformer  # noqa: E402
from stock.w12_linear import w12_modules  # noqa: E402


@pytest.mark.parametrize("budget", [0, 12])
def test_captured_first_pass_slots_give_the_eager_static_path(budget):
    model = Transformer.random(PRESETS["tiny-qwen3"], "cuda", torch.bfloat16, seed=1, std=0.08)
    opts = Options({"weights": "w12", "draft_len": 4, "two_level": True,
                    **({"tree_budget": budget} if budget else {})})
    graphs = Engine(model, opts, 256)
    eager = Engine(model, opts, 256, static=True, capture=False)
    assert graphs.uses_graphs
    gen = torch.Generator().manual_seed(0)
    motif = torch.randint(1, 512, (4,), generator=gen).tolist()
    for prompt in (motif * 6, torch.randint(1, 512, (20,), generator=gen).tolist()):
        drafter = DraftModelDrafter(model, 256, num_layers=1)
        a = graphs.generate(prompt, 32, drafter)
        b = eager.generate(prompt, 32, DraftModelDrafter(model, 256, num_layers=1))
        assert a.tokens == b.tokens and a.accepted == b.accepted
    first = graphs._first_runner
    assert first is not None and any(s.graph is not None for s in first.slots.values())
    assert all(m.view == "w12" for m in w12_modules(model))
