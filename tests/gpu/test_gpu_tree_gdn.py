"""Memory entry tree-verify-gdn on CUDA: a hybrid target's tree steps captured in CUDA
graphs (the graph runner's tree slots: the GDN plan made on the device, staging put in
path order inside the graph) give the eager static tree steps' tokens and accepted counts,
bit for bit, whichever node bucket a tree lands in. Runs where the entry is applied
(bench/gpu_hybrid.sh tree)."""

from __future__ import annotations

import pytest
import torch

from stock.options import REGISTRY, Options

if "tree_budget" not in REGISTRY:
    pytest.skip("option tree_budget comes with the memory entries tree-verify and "
                "tree-verify-gdn", allow_module_level=True)

from stock.config import PRESETS  # noqa: E402
from stock.drafters.draft_model import DraftModelDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.model import Transformer  # noqa: E402

TINY = PRESETS["tiny-hybrid"]


@pytest.mark.parametrize("budget", [8, 32])
def test_captured_hybrid_tree_steps_give_the_eager_static_tree_steps(budget):
    model = Transformer.random(TINY, "cuda", torch.bfloat16, seed=4, std=0.08)
    other = Transformer.random(TINY, "cuda", torch.bfloat16, seed=4, std=0.08)
    gen = torch.Generator(device="cuda").manual_seed(5)
    with torch.no_grad():   # a draft model that is mostly right: trees branch
        for p in other.parameters():
            p.add_((0.02 * torch.randn(p.shape, device="cuda", generator=gen)).to(p.dtype))
    opts = Options({"draft_len": 6, "tree_budget": budget})
    graphs = Engine(model, opts, 256)
    eager = Engine(model, opts, 256, static=True, capture=False)
    assert graphs.uses_graphs
    cpu = torch.Generator().manual_seed(7)
    motif = torch.randint(1, 512, (5,), generator=cpu).tolist()
    for prompt in (motif * 4 + [9], torch.randint(1, 512, (40,), generator=cpu).tolist()):
        a = graphs.generate(prompt, 32, DraftModelDrafter(other, 256))
        b = eager.generate(prompt, 32, DraftModelDrafter(other, 256))
        assert a.tokens == b.tokens and a.accepted == b.accepted
        assert max(a.accepted) > 1
    assert any(s.tree and s.graph is not None for s in graphs.runner.slots.values())
