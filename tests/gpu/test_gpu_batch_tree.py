"""Memory entry batch-tree-verify on CUDA: the batched tree slots replayed from CUDA graphs
(compiled layers and tree regions, or eager) serve every request's single-request AR output
in fp32, the trees built on the device (the Triton tree_build_rows kernel) equal its
PyTorch reference, and device-built and host-given tree slots give the same bits."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("stock.batch_tree",
                    reason="batched trees come with the memory entry batch-tree-verify")

from stock.batch import BatchEngine  # noqa: E402
from stock.batch_tree import trees_on_device  # noqa: E402
from stock.config import PRESETS  # noqa: E402
from stock.drafters.block import BlockConfig, BlockNet  # noqa: E402
from stock.drafters.block_batch import BatchBlockDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.model import Transformer  # noqa: E402
from stock.options import Options  # noqa: E402


def _setup(dtype):
    model = Transformer.random(PRESETS["tiny-qwen3"], "cuda", dtype, seed=1, std=0.08)
    cfg = BlockConfig.for_target(model.cfg, num_layers=2, block_size=8)
    net = BlockNet(cfg).init_from_target(model)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 512, (n,), generator=gen).tolist()
               for n in (5, 17, 9, 30, 3, 12)]
    return model, net, prompts


@pytest.mark.parametrize("compile", [False, True])
def test_captured_batched_trees_serve_the_single_request_ar_outputs(compile):
    model, net, prompts = _setup(torch.float32)
    want = [Engine(model, Options({"cuda_graphs": False}), 256).generate(p, 24).tokens
            for p in prompts]
    opts = Options({"draft_len": 7, "block_size": 8, "tree_budget": 16, "compile": compile})
    be = BatchEngine(model, opts, max_batch=4, max_context=256,
                     batch_drafter=BatchBlockDrafter(net, model, 256, rows=5))
    assert trees_on_device(be)
    reqs = [be.submit(p, 24) for p in prompts]
    be.run()
    assert [r.tokens for r in reqs] == want
    lattice_slots = [s for k, s in be.runner.slots.items() if "lattice" in k]
    assert lattice_slots and all(s.graph is not None for s in lattice_slots)


def test_the_tree_build_kernel_for_rows_equals_its_reference():
    from kernels.tree_build import reference_tree_build_rows, tree_build_rows

    gen = torch.Generator().manual_seed(3)
    top = torch.log_softmax(torch.randn(6, 16, 500, generator=gen) * 2, -1).topk(4, -1)
    lattices = torch.stack([top.indices.double(), top.values.double()], dim=1)  # [6,2,16,4]
    ctl = torch.tensor([[7, 15, 16], [9, 3, 16], [11, 0, 1], [13, 15, 9], [2, 8, 32],
                        [5, 15, 32]])
    for t in (16, 32):
        c = ctl.clone()
        c[:, 2] = c[:, 2].clamp(max=t)
        want = reference_tree_build_rows(lattices, c, t)
        got = tree_build_rows(lattices.cuda(), c.cuda(), t).cpu()
        assert torch.equal(got, want)


def test_device_built_and_host_given_tree_slots_give_the_same_bits():
    """The same requests through tree_build device and host (fp32, graphs): the same
    tokens and the same acceptance step by step."""
    model, net, prompts = _setup(torch.float32)
    outs = []
    for build in ("device", "host"):
        opts = Options({"draft_len": 7, "block_size": 8, "tree_budget": 16,
                        "tree_build": build})
        be = BatchEngine(model, opts, max_batch=4, max_context=256,
                         batch_drafter=BatchBlockDrafter(net, model, 256, rows=5))
        reqs = [be.submit(p, 24) for p in prompts]
        be.run()
        outs.append([(r.tokens, r.accepted) for r in reqs])
    assert outs[0] == outs[1]
