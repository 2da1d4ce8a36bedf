"""The device tree build (kernels/tree_build): its PyTorch reference builds the tree that
stock/tree.py's host `build` builds (best-first under the budget, at most k deep), and the
Triton kernel the reference's bits (CPU: TRITON_INTERPRET=1; CUDA: the real kernel)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels.tree_build builds its kernel

import pytest
import torch

from kernels.tree_build import reference_tree_build, tree_build
from stock.tree import build

DEV = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL = DEV == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _lattice(seed: int, depth: int, width: int, vocab: int = 500, pad: int = 0):
    """A packed lattice [2, depth, width] float64 as a drafter writes it: top-k ids and
    log-probs per position, best first; the last `pad` ranks of odd rows padded."""
    gen = torch.Generator().manual_seed(seed)
    top = torch.log_softmax(torch.randn(depth, vocab, generator=gen) * 2, -1).topk(width, -1)
    ids, lp = top.indices.double(), top.values.double()
    if pad:
        ids[1::2, width - pad:] = -1
        lp[1::2, width - pad:] = float("-inf")
    return torch.stack([ids, lp])


def _host(lattice, root, k, budget, t):
    """stock/tree.py's build, padded to t like the device tree."""
    tree = build(lattice[0].long(), lattice[1].float(), root, budget, k)
    tokens, parents, depths = tree.padded(t)
    return tokens, parents, depths, len(tree)


def _check_tree(tokens, parents, depths):
    """Parents come first and sit one level up; padding hangs from the root at depth 0."""
    for i in range(1, len(tokens)):
        if depths[i]:
            assert parents[i] < i and depths[parents[i]] == depths[i] - 1
        else:
            assert parents[i] == 0


@pytest.mark.parametrize("seed,depth,width,k,budget,t,pad", [
    (0, 5, 3, 5, 9, 16, 0), (1, 15, 4, 15, 32, 32, 0), (2, 15, 4, 6, 20, 32, 0),
    (3, 15, 4, 15, 64, 64, 1), (4, 15, 4, 3, 64, 64, 0), (5, 8, 8, 8, 16, 16, 3),
    (6, 15, 4, 0, 32, 32, 0), (7, 2, 2, 2, 64, 64, 0), (8, 15, 4, 15, 2, 2, 0)])
def test_reference_builds_the_host_tree(seed, depth, width, k, budget, t, pad):
    lattice = _lattice(seed, depth, width, pad=pad)
    ctl = torch.tensor([11, k, budget, 0])
    tokens, parents, depths = reference_tree_build(lattice, ctl, t)
    want_tokens, want_parents, want_depths, real = _host(lattice, 11, k, budget, t)
    assert tokens.tolist() == want_tokens
    assert parents.tolist() == want_parents
    assert depths.tolist() == want_depths
    assert int((depths > 0).sum()) == real - 1
    assert int(depths.max()) <= k


def test_reference_keeps_a_tree_where_children_tie_their_parents():
    """Log-probs of exactly 0 (a certain token) make a child score what its parent scores:
    the shallower node still comes first, so every node's parent is in the tree."""
    lattice = _lattice(9, 10, 4)
    lattice[1, :, 0] = 0.0                      # every top-1 certain
    lattice[1, 3:, 1] = lattice[1, 3:, 2] = -1.0  # and ties among siblings
    tokens, parents, depths = reference_tree_build(lattice, torch.tensor([5, 10, 24, 0]), 32)
    _check_tree(tokens.tolist(), parents.tolist(), depths.tolist())
    assert depths.tolist()[1:11] == list(range(1, 11))   # the certain chain first, whole


@pytest.mark.skipif(not KERNEL, reason="no CUDA and TRITON_INTERPRET is not 1")
@pytest.mark.parametrize("seed,depth,width,k,budget,t,pad,ties", [
    (0, 5, 3, 5, 9, 16, 1, False), (1, 15, 4, 15, 32, 32, 0, False),
    (2, 15, 4, 6, 20, 32, 0, True), (3, 15, 4, 15, 64, 64, 0, True)])
def test_kernel_equals_the_reference(seed, depth, width, k, budget, t, pad, ties):
    lattice = _lattice(seed, depth, width, pad=pad)
    if ties:
        lattice[1, ::3, 0] = 0.0
        lattice[1, 1::2, 1:] = -0.5
    ctl = torch.tensor([3, k, budget, 0])
    want = reference_tree_build(lattice, ctl, t)
    got = tree_build(lattice.to(DEV), ctl.to(DEV), t)
    for a, b in zip(got, want):
        assert a.cpu().tolist() == b.tolist()
    _check_tree(*(x.cpu().tolist() for x in got))


@pytest.mark.skipif(not KERNEL, reason="no CUDA and TRITON_INTERPRET is not 1")
def test_kernel_refuses_a_bucket_that_is_not_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        tree_build(_lattice(0, 4, 2).to(DEV), torch.tensor([1, 4, 8, 0], device=DEV), 12)


def test_stock_device_tree_is_the_reference_off_cuda():
    from stock.tree import device_tree

    lattice = _lattice(4, 15, 4)
    ctl = torch.tensor([2, 9, 24, 0])
    got = device_tree(lattice, ctl, 32)
    want = reference_tree_build(lattice, ctl, 32)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
