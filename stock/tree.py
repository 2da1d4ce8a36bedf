"""Draft trees: a best-first tree over a draft lattice, and the tensors that verify one.

A draft lattice holds, per drafted position, the top-k tokens and their log-probabilities
(stock/drafters/base.py). A chain verifies only its top-1 tokens; a tree spends a node budget
on the most probable paths through the lattice. `build` grows it best-first by cumulative
path log-probability with a heap: each pop emits a node and pushes its next sibling (the
next-ranked token at the same depth under the same parent) and its first child (the top
token at the next depth). Every lattice log-probability is <= 0, so a node's parent always
scores at least as high as the node and the emitted set is a tree (DDTree's construction).
Node 0 is the root, the pending token; nodes are numbered in emission order, so a parent's
index is below its children's (a topological order).

The verification tensors work on a fixed number of nodes T (a step bucket), padding after
the real nodes: padded nodes have depth 0 (never accepted) and the root as parent.

- `ancestors(parents)`: [T, T] bool, node i sees node j iff j is i or one of its ancestors,
  by pointer doubling (log2 T gathers, no host loop: a CUDA graph can run it);
- `visibility(anc, start, kv_len)`: [T, kv_len] bool: the committed context [0, start)
  plus the node's own ancestors at slots start + j;
- `accept(ids, parents, depths, anc, target)`: the greedy walk on the device: node i is
  accepted iff its token equals the target's argmax at its parent and so is every ancestor's;
  returns the accepted depth n and `path` [T] (path[d] = the accepted node at depth d, path[0]
  the root, identity past n);
- `tree_table(anc, depths, start)`: the tree as kernels/attention's split-KV kernel takes it
  (start, depths, each node's path), so that a node's attention is its root path's as a
  chain, bit for bit;
- `compact(bufs, start, path)`: K/V of the accepted nodes moved from slots start + path[d]
  to start + d, so the committed prefix is contiguous (a chain's path is already the
  identity and moves nothing it did not hold);
- `device_tree(lattice, ctl, t)`: the same best-first tree built on the device from the
  drafter's packed lattice (kernels/tree_build: a Triton program on CUDA, its PyTorch
  reference elsewhere), so that no lattice or tree crosses to the host: the padded tokens,
  parents and depths, ties broken shallower first (identical to `build` where no two paths
  tie);
- `tree_prep` and `tree_accept`: the step's tree tensors before the forward (ancestors and
  the kernel's table) and after it (argmax, walk, packed result), as two functions of device
  tensors only, so that a compiled step can run each as one torch.compile region: eager,
  they are some 60 small kernels a step.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    tokens: list[int]     # node tokens; node 0 is the root (the pending token)
    parents: list[int]    # parents[0] = -1
    depths: list[int]     # depths[0] = 0
    scores: list[float]   # cumulative log-probability of the path to the node (root 0)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        """Each node the child of the one before it: the chain's shape (no mask needed)."""
        return all(p == i - 1 for i, p in enumerate(self.parents[1:], start=1))

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def children(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.tokens]
        for i, p in enumerate(self.parents[1:], start=1):
            out[p].append(i)
        return out

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to `node`, both included."""
        path = [node]
        while path[-1] != 0:
            path.append(self.parents[path[-1]])
        return path[::-1]

    def padded(self, t: int) -> tuple[list[int], list[int], list[int]]:
        """(tokens, parents, depths) padded to t nodes; padding has depth 0, parent 0 and the
        root's token (a valid id whose rows nobody reads)."""
        if t < len(self):
            raise ValueError(f"a tree of {len(self)} nodes does not fit {t}")
        pad = t - len(self)
        return (self.tokens + [self.tokens[0]] * pad, [0] + self.parents[1:] + [0] * pad,
                self.depths + [0] * pad)


def build(ids: torch.Tensor, logprobs: torch.Tensor, root: int, budget: int,
          max_depth: int | None = None) -> DraftTree:
    """The best-first tree of at most `budget` nodes, the root included, over a lattice
    (ids [n, K] with -1 padding, logprobs [n, K] with -inf padding), at most `max_depth`
    (default n) deep. Ties go to the earlier push (the shallower, higher-ranked node)."""
    if budget < 1:
        raise ValueError(f"a tree needs a budget of at least 1 node, not {budget}")
    n = ids.shape[0] if max_depth is None else min(max_depth, ids.shape[0])
    rows = []   # per depth: the distinct valid (token, logprob), best rank first
    # one host copy of the lattice (a tolist per depth was 37 of the 68 us a 32-node build
    # took on the 2-core CPU, 2026-12-02)
    for tok_row, lp_row in zip(ids[:n].tolist(), logprobs[:n].tolist()):
        seen, row = set(), []
        for tok, lp in zip(tok_row, lp_row):
            if tok >= 0 and lp != float("-inf") and tok not in seen:
                seen.add(tok)
                row.append((tok, min(float(lp), 0.0)))
        if not row:
            break
        rows.append(row)
    n = len(rows)
    tree = DraftTree([root], [-1], [0], [0.0])
    heap: list[tuple[float, int, int, int, int]] = []   # (-score, order, parent, depth, rank)
    order = 0
    if n:
        heap.append((-rows[0][0][1], order, 0, 1, 0))
    while heap and len(tree) < budget:
        neg, _, parent, depth, rank = heapq.heappop(heap)
        node = len(tree)
        tree.tokens.append(rows[depth - 1][rank][0])
        tree.parents.append(parent)
        tree.depths.append(depth)
        tree.scores.append(-neg)
        base = tree.scores[parent]
        if rank + 1 < len(rows[depth - 1]):   # next sibling
            order += 1
            heapq.heappush(heap, (-(base + rows[depth - 1][rank + 1][1]), order, parent,
                                  depth, rank + 1))
        if depth < n:                          # first child
            order += 1
            heapq.heappush(heap, (-(-neg + rows[depth][0][1]), order, node, depth + 1, 0))
    return tree


def walk(tree: DraftTree, target: list[int]) -> list[int]:
    """Host reference of the greedy walk: the accepted nodes from the root (included),
    following the child whose token is the target's argmax at the current node."""
    kids = tree.children()
    path = [0]
    while True:
        nxt = [c for c in kids[path[-1]] if tree.tokens[c] == target[path[-1]]]
        if not nxt:
            return path
        path.append(nxt[0])


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """[T, T] bool from parents [T] (int64; the root's parent is itself or -1, clamped):
    anc[i, j] iff j is i or an ancestor of i. Pointer doubling: ceil(log2 T) steps."""
    t = parents.shape[0]
    up = parents.clamp(min=0)
    anc = torch.eye(t, dtype=torch.bool, device=parents.device)
    anc = anc | torch.zeros_like(anc).scatter_(1, up.view(t, 1), True)
    steps = max(1, (t - 1).bit_length())
    for _ in range(steps):
        anc = anc | anc[up]      # distances [0, 2^k] from [0, 2^(k-1)] twice
        up = up[up]
    return anc


def visibility(anc: torch.Tensor, start: torch.Tensor | int, kv_len: int) -> torch.Tensor:
    """[T, kv_len] bool: slots before `start` (the committed context) and the node's own
    ancestors at slots start + j; nothing else (stale slots, other branches, padding)."""
    t = anc.shape[0]
    keys = torch.arange(kv_len, device=anc.device)
    rel = keys - start
    inside = (rel >= 0) & (rel < t)
    own = anc.gather(1, rel.clamp(0, t - 1).unsqueeze(0).expand(t, kv_len))
    return (keys < start).unsqueeze(0) | (inside.unsqueeze(0) & own)


def accept(ids: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
           anc: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy walk on the device. ids, parents, depths, target [T] (target: the target's
    argmax at each node). Returns n (0-dim int64: accepted draft nodes = the accepted depth)
    and path [T] int64: path[0] = 0, path[d] the accepted node at depth d for d <= n, and d
    itself past n (identity: `compact` then leaves those slots alone)."""
    t = ids.shape[0]
    up = parents.clamp(min=0)
    steps = torch.arange(t, device=ids.device)
    # no host scalar is written into a device tensor: a CUDA graph captures all of this
    good = ((ids == target[up]) & (depths > 0)) | (steps == 0)
    accepted = ~(anc & ~good.unsqueeze(0)).any(1) & (depths > 0)
    n = (depths * accepted).max()
    at = accepted.unsqueeze(0) & (depths.unsqueeze(0) == steps.unsqueeze(1))   # [depth, node]
    path = (at.long() * steps.unsqueeze(0)).sum(1)
    path = torch.where((steps <= n) & (steps > 0), path, steps)   # root 0, identity past n
    return n, path


def tree_table(anc: torch.Tensor, depths: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """kernels/attention's tree argument: [1 + T + 64 T] int64 = the context length `start`
    (0-dim int64 on the device), each node's depth, then per node its path (64 entries: its
    ancestor at depth e, itself at its own depth, 0 past it), from the ancestor matrix anc
    [T, T] and depths [T]. Depths stay below 64 (T <= 64). No host value enters: a CUDA
    graph captures it."""
    t = anc.shape[0]
    if t > 64:
        raise ValueError(f"a tree of {t} tokens is over the kernel's 64")
    levels = torch.arange(64, device=anc.device)
    nodes = torch.arange(t, device=anc.device)
    at = anc.unsqueeze(2) & (depths.view(1, t, 1) == levels.view(1, 1, 64))  # [i, j, e]
    paths = (at.long() * nodes.view(1, t, 1)).sum(1)
    return torch.cat([start.reshape(1).long(), depths.long(), paths.reshape(-1)])


def compact(bufs: list[torch.Tensor], start: torch.Tensor | int, path: torch.Tensor) -> None:
    """Move the accepted nodes' K/V from slots start + path[d] to start + d in each buffer:
    a layer's [B, Hkv, slots, D], or all layers' at once ([L, B, Hkv, slots, D], KVCache's
    k_all / v_all: one gather and one scatter for the whole cache). path[d] >= d (parents
    come first), and the rows are gathered before any is written, so no source is
    overwritten before it is read."""
    t = path.shape[0]
    dst = start + torch.arange(t, device=path.device)
    src = start + path
    for buf in bufs:
        dim = buf.dim() - 2
        buf.index_copy_(dim, dst, buf.index_select(dim, src))


def tree_prep(parents: torch.Tensor, depths: torch.Tensor,
              start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Before a tree step's forward: (ancestors [T, T], tree_table) from the padded parents
    and depths [T] and the 0-dim start, all on the device."""
    anc = ancestors(parents)
    return anc, tree_table(anc, depths, start)


def tree_accept(ids: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                anc: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """After it: from the step's logits [T, vocab], (target [T], n, path [T], packed) where
    packed = (n, then the target's token at each accepted node: the n + 1 new tokens)."""
    target = logits.argmax(-1)
    n, path = accept(ids, parents, depths, anc, target)
    return target, n, path, torch.cat([n.view(1), target[path]])


def device_tree(lattice: torch.Tensor, ctl: torch.Tensor,
                t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The best-first tree of a packed lattice [2, D, K] float64 (ids, log-probs; a block
    drafter's `draft_packed`) with ctl [>= 3] int64 = (root token, depth limit k, budget),
    all on one device: (tokens, parents, depths), each [t] int64 padded as `DraftTree.padded`
    pads (kernels/tree_build's module doc). Runs the Triton kernel on CUDA and its reference
    elsewhere; no host synchronisation either way."""
    if lattice.device.type == "cuda":
        from kernels.tree_build import tree_build  # lazy: triton, only on CUDA

        return tree_build(lattice, ctl, t)
    from kernels.tree_build.reference import reference_tree_build  # lazy: package imports triton

    return reference_tree_build(lattice, ctl, t)
