"""Plain-PyTorch reference of the device tree build (any device, no host synchronisation).

The draft lattice arrives packed as a drafter writes it on the device: `lattice` [2, D, K]
float64 = the top-K token ids per drafted position (row 0; -1 pads) and their log-probs
(row 1; -inf pads), position d being depth d + 1 of the tree. `ctl` [4] int64 on the same
device holds (root token, k, budget, unused): the tree is at most k deep and has at most
`budget` nodes, the root (the pending token) included.

The tree is the best-first one (stock/tree.py's `build`): the budget - 1 most probable
paths by cumulative log-probability, each log-probability taken as min(lp, 0) and summed in
fp32. Every such score is at most its parent's, so the best nodes of a depth all hang from
the best nodes of the depth above: a beam of the T best nodes per depth (T >= budget - 1)
holds every node of the tree, and the tree is the best budget - 1 nodes of all beams.
Ties are broken by a total order (shallower first, then the earlier parent in its beam,
then the higher rank), so the node set is a tree even where a child scores as high as its
parent (a log-probability of exactly 0).

Returns the padded tree as stock/tree.py's verification tensors take it, each [T] int64:
tokens (node 0 the root; padding repeats the root's token), parents (the root's and the
padding's 0) and depths (padding 0). Nodes are in best-first order, so a parent's index is
below its children's.
"""

from __future__ import annotations

import torch


def _scores(lattice: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[D, K] fp32 log-probs, min(lp, 0), -inf at padded entries and at depths past k."""
    d = lattice.shape[1]
    lp = lattice[1].float().clamp(max=0.0)
    bad = (lattice[0] < 0) | (torch.arange(d, device=lattice.device) >= k).unsqueeze(1)
    return lp.masked_fill(bad, float("-inf"))


def _top(keys: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the n best of `keys` [M] (higher first; ties to the lower index)."""
    order = torch.sort(keys, descending=True, stable=True).indices
    return order[:n]


def reference_tree_build(lattice: torch.Tensor, ctl: torch.Tensor, t: int):
    """(tokens, parents, depths), each [t] int64 on lattice's device; see the module doc."""
    if lattice.dim() != 3 or lattice.shape[0] != 2:
        raise ValueError(f"a packed lattice is [2, D, K], not {list(lattice.shape)}")
    dev = lattice.device
    depth_n, width = lattice.shape[1], lattice.shape[2]
    root, k, budget = ctl[0], ctl[1], ctl[2]
    lp = _scores(lattice, k)
    ninf = torch.tensor(float("-inf"), device=dev)
    # level 0 (depth 1): the ranks themselves, hanging from the root
    level_score = torch.full((depth_n, t), float("-inf"), device=dev)
    level_parent = torch.zeros(depth_n, t, dtype=torch.long, device=dev)
    level_rank = torch.zeros(depth_n, t, dtype=torch.long, device=dev)
    first = torch.full((max(t, width),), float("-inf"), device=dev)
    first[:width] = lp[0]
    pick = _top(first, t)
    level_score[0] = first[pick]
    level_rank[0] = pick.clamp(max=width - 1)
    for d in range(1, depth_n):
        cand = (level_score[d - 1].unsqueeze(1) + lp[d].unsqueeze(0)).reshape(-1)  # [t*K]
        cand = torch.where(torch.isnan(cand), ninf, cand)
        pick = _top(cand, t)
        level_score[d] = cand[pick]
        level_parent[d] = pick // width
        level_rank[d] = pick % width
    # the tree: the budget - 1 best of all levels (shallower first on ties)
    flat = level_score.reshape(-1)
    best = _top(flat, t - 1)                       # [t - 1] indices into [D * t]
    node = torch.arange(1, t, device=dev)
    valid = (flat[best] > float("-inf")) & (node < budget)
    where = torch.zeros(depth_n * t, dtype=torch.long, device=dev)
    where[best] = torch.where(valid, node, 0)
    d_of = best // t
    parent = torch.where(d_of > 0, where[((d_of - 1) * t + level_parent.reshape(-1)[best])
                                        .clamp(min=0)], 0)
    ids = lattice[0].long()
    token = ids[d_of, level_rank.reshape(-1)[best]]
    tokens = torch.cat([root.view(1), torch.where(valid, token, root)])
    parents = torch.cat([torch.zeros(1, dtype=torch.long, device=dev),
                         torch.where(valid, parent, 0)])
    depths = torch.cat([torch.zeros(1, dtype=torch.long, device=dev),
                        torch.where(valid, d_of + 1, 0)])
    return tokens, parents, depths
