"""τ exactly: the greedy decode loop simulated over teacher-forced lattices.

For greedy decoding the output is the target's own continuation at every position, so a
draft tree can be scored against it exactly, off the chain as well as on it: after a node
whose path from the root spells the output, the target's argmax is the output's next token.
But a tree changes where later steps start (a step that accepts more starts the next one
further on, where the drafter proposes something else), so the τ of a tree does not follow
from re-scoring the steps of a chain run; the whole loop is simulated instead.

Inputs, per request: the greedy output and the drafter's lattice at every position p of it
(`lattices[p]`: the lattice a step starting with committed prompt + output[:p] and pending
token output[p] gets; judges/worker_main.teacher_forced records them). The loop is the
engine's: at p, the tree rooted at output[p] (stock.tree.build over lattices[p]; the chain of
`max_depth` tokens is the tree over the lattice's top-1 column), the greedy walk
(stock.tree.walk) with each node's target token read off the output, n nodes accepted,
n + 1 tokens gained (the bonus included), the last step no more than the output has left
(GenResult.accepted counts only the tokens the engine keeps), the next step at p + n + 1,
until the output is complete.

Exact for any drafter whose lattice depends only on the committed prefix (n-gram exactly;
the block drafter up to fp32 rounding, tests/test_tau.py). Where a request ends at a stop
token, the engine may verify tokens after it; it drops them and does not count them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

UNKNOWN = -1   # a node's target token where the output does not say (off its path, past it)


def _tree_module():
    # lazy: stock.tree imports torch (2 s); the judges' process and the CLI load it only here
    from stock import tree

    return tree


def node_targets(tree, output: list[int], p: int) -> list[int]:
    """The target's argmax at each node of `tree` (rooted at output[p]), as far as the
    output tells it: a node at depth d whose path from the root is output[p : p + d + 1]
    has output[p + d + 1] (UNKNOWN past the output's end); any other node UNKNOWN (the
    greedy walk never stands on one: it follows only children whose token is the target's
    argmax, so it stays on the output's path)."""
    on_path = [False] * len(tree)
    out = [UNKNOWN] * len(tree)
    for i, (tok, parent, depth) in enumerate(zip(tree.tokens, tree.parents, tree.depths)):
        on_path[i] = (i == 0 or on_path[parent]) and p + depth < len(output) \
            and tok == output[p + depth]
        if on_path[i] and p + depth + 1 < len(output):
            out[i] = output[p + depth + 1]
    return out


def accepted(tree, output: list[int], p: int) -> int:
    """Draft nodes a step rooted at output[p] accepts with `tree` (its accepted depth)."""
    return len(_tree_module().walk(tree, node_targets(tree, output, p))) - 1


def _arrays(lattice) -> tuple[np.ndarray, np.ndarray]:
    """(ids [n, K] int64, logprobs [n, K] float64) from a DraftLattice, an (ids, logprobs)
    pair of arrays or tensors, or a measurement's {"ids", "logprobs"} lists (n may be 0)."""
    if isinstance(lattice, dict):
        ids, lps = lattice["ids"], lattice["logprobs"]
    elif hasattr(lattice, "ids"):
        ids, lps = lattice.ids, lattice.logprobs
    else:
        ids, lps = lattice
    ids = np.asarray(ids, dtype=np.int64)
    lps = np.asarray(lps, dtype=np.float64)
    if ids.size == 0:
        return np.zeros((0, 1), np.int64), np.zeros((0, 1))
    return ids.reshape(len(ids), -1), lps.reshape(len(lps), -1)


def step_tree(lattice, root: int, budget: int | None, max_depth: int | None = None):
    """The tree a step verifies: best-first over the lattice with at most `budget` nodes
    (the root included) and `max_depth` (default: the lattice's depth) levels, or, for
    budget None, the chain: the tree over the lattice's top-1 column, max_depth deep."""
    ids, lps = _arrays(lattice)
    depth = len(ids) if max_depth is None else min(max_depth, len(ids))
    if budget is None:
        ids, lps, budget = ids[:, :1], lps[:, :1], depth + 1
    return _tree_module().build(ids, lps, root, budget, depth)


@dataclass(frozen=True)
class Decode:
    """One simulated decode (or several, concatenated): per verification step its start
    position, the nodes it verified and the tokens it gained (bonus included)."""

    starts: tuple[int, ...]
    nodes: tuple[int, ...]
    gained: tuple[int, ...]

    @property
    def steps(self) -> int:
        return len(self.gained)

    @property
    def tokens(self) -> int:
        return sum(self.gained)

    @property
    def tau(self) -> float:
        """Tokens gained per step, as GenResult.tau."""
        return self.tokens / max(self.steps, 1)

    @property
    def nodes_per_step(self) -> float:
        return sum(self.nodes) / max(self.steps, 1)

    def __add__(self, other: "Decode") -> "Decode":
        return Decode(self.starts + other.starts, self.nodes + other.nodes,
                      self.gained + other.gained)


EMPTY = Decode((), (), ())


def simulate_decode(lattices, output: list[int], budget: int | None,
                    max_depth: int | None = None) -> Decode:
    """The greedy decode of one request with trees of `budget` nodes (None: the chain),
    over its teacher-forced `lattices` (lattices[p] for every p < len(output) - 1) and its
    greedy `output` (output[0] is the prefill's token: no step gains it). The last step
    gains no more than the output has left, as the engine counts only the tokens it keeps."""
    if len(output) > 1 and len(lattices) < len(output) - 1:
        raise ValueError(f"{len(lattices)} lattices for an output of {len(output)} tokens: "
                         f"need one at every position before the last")
    starts, nodes, gained = [], [], []
    p = 0
    while p < len(output) - 1:
        tree = step_tree(lattices[p], output[p], budget, max_depth)
        n = accepted(tree, output, p)
        starts.append(p)
        nodes.append(len(tree))
        gained.append(min(n + 1, len(output) - 1 - p))
        p += gained[-1]
    return Decode(tuple(starts), tuple(nodes), tuple(gained))


def simulate_requests(forced, budget: int | None, max_depth: int | None = None) -> Decode:
    """simulate_decode over several requests, `forced` = [(lattices, output), ...]; their
    steps concatenated (τ = all tokens over all steps, as the engine's runs are averaged)."""
    total = EMPTY
    for lattices, output in forced:
        total = total + simulate_decode(lattices, output, budget, max_depth)
    return total
