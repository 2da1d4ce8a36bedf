"""The cache of a hybrid target: the KV cache of its full-attention layers and, per GDN
layer, the recurrent state after the committed tokens (fp32 [B, Hv, Dk, Dv]) and the conv
window (the last K-1 inputs of its short conv, [B, C, K-1]).

A step's GDN layers only read the committed state and stage what the commit needs
(`stage`); `commit(length)` then keeps exactly the state after the step's accepted tokens:
the state the step computed after all of them when it accepted everything, else the delta
rule replayed from the committed state along the accepted prefix (one state read and one
write per layer), and the window shifted by the accepted columns. A step that accepts no
draft still advances by its one real token. A recurrent state cannot be rolled back to an
arbitrary length the way the KV cache can: `rollback` goes to 0 (a new request), to the
committed length (drops a staged step), or to the length saved by `mark()` (the draft
model's context, from which it re-feeds what it shares with the next context).

A batched step (stock/batch.py: each cache row a request at its own committed length, which
the batch engine keeps) reads the committed rows it names (`gdn_rows`), stages like a
single step, and `commit_rows` keeps each row's state after its accepted tokens the way a
single request's step of that row's real tokens would (its padding never enters a state);
`reset_rows` clears a row a new request takes. A batched step replayed from a CUDA graph
(stock/batch_graphs.py) hands its slot's staging back with `restage_rows`.

The committed state's buffers never move (commit and rollback write into them), so a step
captured in a CUDA graph reads the current state at every replay; a static step's staged
buffers belong to its graph slot, which hands them back after each replay (`restage`).
"""

from __future__ import annotations

import torch

from kernels.gdn import chunk_rule, recurrent_rule
from stock.cache import KVCache
from stock.config import ModelConfig
from stock.errors import StockError


class StateError(StockError):
    pass


class HybridCache(KVCache):
    def __init__(self, cfg: ModelConfig, max_len: int, batch: int = 1,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 num_layers: int | None = None):
        n = cfg.num_layers if num_layers is None else num_layers
        attn = sum(cfg.layer_type(i) == "full_attention" for i in range(n))
        super().__init__(cfg, max_len, batch, device, dtype, num_layers=attn)
        conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim \
            + cfg.linear_num_value_heads * cfg.linear_value_head_dim
        self.gdn_layers = [i for i in range(n) if cfg.layer_type(i) == "linear_attention"]
        self.window = {i: torch.zeros(batch, conv_dim, cfg.linear_conv_kernel - 1,
                                      device=device, dtype=dtype) for i in self.gdn_layers}
        self.state = {i: torch.zeros(batch, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                     cfg.linear_value_head_dim, device=device,
                                     dtype=torch.float32) for i in self.gdn_layers}
        self._staged: dict[int, tuple] = {}
        self._step: tuple[int, int] | None = None   # (start, tokens) of the staged step
        self._mark: tuple[int, dict, dict] | None = None

    # -- what a step's GDN layers call ------------------------------------------------------
    def gdn_state(self, layer: int, start: int | None):
        """The committed (window, state) a step at `start` reads; a recurrent state exists
        only after the committed tokens, so a step must start there. A static step (start
        None: its start is a device tensor) is trusted to; its commit checks the range."""
        if start is not None and start != self.length:
            raise StateError(f"a GDN step must start at the committed length {self.length}, "
                             f"not {start} (a recurrent state cannot be rewound)")
        return self.window[layer], self.state[layer]

    def stage(self, layer: int, start: int | None, mixed, k, v, g, beta, final) -> None:
        self._staged[layer] = (mixed, k, v, g, beta, final)
        self._step = (self.length if start is None else start, mixed.shape[1])

    def take_staged(self) -> dict[int, tuple]:
        """What the last step staged (a static step keeps it: its buffers are the graph's)."""
        return dict(self._staged)

    def restage(self, staged: dict[int, tuple], start: int) -> None:
        """A replayed static step's staging (its graph rewrote those buffers)."""
        self._staged = dict(staged)
        t = next(iter(staged.values()))[0].shape[1] if staged else 0
        self._step = (start, t)

    # -- commit and rollback ------------------------------------------------------------------
    def commit(self, length: int) -> None:
        if self._step is None:
            if length != self.length:
                raise StateError(f"commit to {length} with no step staged at the committed "
                                 f"length {self.length}")
            return
        start, t = self._step
        n = length - start
        if not 0 <= n <= t or start != self.length:
            raise StateError(f"commit to {length}: the staged step covers {start}..{start + t}")
        super().commit(length)
        for layer, (mixed, k, v, g, beta, final) in self._staged.items():
            # in place: a captured step reads these buffers at every replay
            if n == t:
                self.state[layer].copy_(final)
            elif n > 0:   # the accepted prefix, replayed from the committed state
                _, new = recurrent_rule(k[:, :n], k[:, :n], v[:, :n], g[:, :n], beta[:, :n],
                                        self.state[layer])
                self.state[layer].copy_(new)
            if n > 0:
                w = self.window[layer]
                cols = torch.cat([w, mixed[:, :n].transpose(1, 2).to(w.dtype)], dim=-1)
                w.copy_(cols[..., cols.shape[-1] - w.shape[-1]:])
        self._staged, self._step = {}, None

    def rollback(self, length: int) -> None:
        self._staged, self._step = {}, None
        if length == self.length:
            return
        if length == 0:
            super().rollback(0)
            self._mark = None
            for layer in self.gdn_layers:
                self.window[layer].zero_()
                self.state[layer].zero_()
            return
        if self._mark is not None and length == self._mark[0]:
            super().rollback(length)
            for i in self.gdn_layers:
                self.window[i].copy_(self._mark[1][i])
                self.state[i].copy_(self._mark[2][i])
            return
        raise StateError(f"the recurrent state cannot roll back to {length} tokens (committed "
                         f"{self.length}; only to 0, to the committed length or to a mark)")

    def mark(self) -> None:
        """Save the committed state, so `rollback` can return to this length."""
        self._mark = (self.length, {i: w.clone() for i, w in self.window.items()},
                      {i: s.clone() for i, s in self.state.items()})

    # -- batched steps: one request per cache row ---------------------------------------------
    def gdn_rows(self, layer: int, rows: torch.Tensor):
        """The committed (window, state) of cache rows `rows` [R] (copies, in the step's row
        order): a batched step's requests, each at its own committed length."""
        return self.window[layer].index_select(0, rows), self.state[layer].index_select(0, rows)

    def stage_rows(self, layer: int, mixed, k, v, g, beta, final) -> None:
        """A batched step's staging, its rows in the order gdn_rows read them."""
        self._staged[layer] = (mixed, k, v, g, beta, final)
        self._step = None

    def restage_rows(self, staged: dict[int, tuple]) -> None:
        """A replayed static batched step's staging (its graph rewrote those buffers; rows
        in the step's order, the B bucket's padding rows after the real ones)."""
        self._staged, self._step = dict(staged), None

    def discard_staged(self) -> None:
        """Drop a staging nothing will commit (a graph's warm-up and capture over the
        spare row)."""
        self._staged, self._step = {}, None

    def check_committed(self) -> None:
        """Before a batched forward: the last one's staging was committed. A forward whose
        rows' states were never committed (a code path that skipped commit_rows) would leave
        them behind the tokens already emitted; say so instead of decoding on."""
        if self._staged:
            raise StateError("a batched step's GDN states were staged but not committed "
                             "(HybridCache.commit_rows) before the next forward")

    def reset_rows(self, rows: list[int]) -> None:
        """The empty state in cache rows `rows` (a new request takes them)."""
        for layer in self.gdn_layers:
            self.window[layer][rows] = 0
            self.state[layer][rows] = 0

    def commit_rows(self, rows: list[int], counts: list[int], real: list[int]) -> None:
        """After a batched step over cache rows `rows` (the order of its gdn_rows reads):
        row i keeps its first counts[i] tokens of the step, whose first real[i] tokens were
        its own (the rest padding to the longest row). The state kept is the one a single
        request's step of those real[i] tokens commits (HybridCache.commit): its final state
        when it accepted them all (computed again over the real tokens where padding
        followed them), else the delta rule replayed along the accepted prefix.

        Batched, not row by row (a row loop is a launch sequence per row and layer: 768 of
        them a step for 48 GDN layers and 16 rows): per layer one copy of the final states,
        one chunked rule per distinct count among the rows that kept all their real tokens
        before padding, one recurrent rule over every partly accepted row at once (steps
        past a row's count masked to decay 1 and beta 0, which leave its state exactly as it
        is), and one gather of every row's new conv window."""
        staged, self._staged = self._staged, {}
        t = next(iter(staged.values()))[0].shape[1] if staged else 0
        for n, r in zip(counts, real):   # all checked before any row changes
            if not 0 <= n <= r <= t:
                raise StateError(f"commit of {n} tokens of a row's {r} (step of {t})")
        live = [i for i, n in enumerate(counts) if n > 0]
        if not staged or not live:
            return
        full = [i for i in live if counts[i] == t]
        whole: dict[int, list[int]] = {}   # count -> rows that kept all their real tokens
        for i in live:
            if counts[i] < t and counts[i] == real[i] > 1:
                whole.setdefault(counts[i], []).append(i)
        part = [i for i in live if counts[i] < t and not (counts[i] == real[i] > 1)]
        dev = next(iter(self.state.values())).device

        def idx(sel: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
            """Rows `sel` of the step, and their cache rows: made once, used by every layer."""
            return (torch.tensor(sel, device=dev),
                    torch.tensor([rows[i] for i in sel], device=dev))

        full_ix, full_at = idx(full)
        whole_ix = {n: idx(sel) for n, sel in whole.items()}
        part_ix, part_at = idx(part)
        live_ix, live_at = idx(live)
        n_part = torch.tensor([counts[i] for i in part], device=dev)
        n_max = int(max((counts[i] for i in part), default=0))
        keep = (torch.arange(n_max, device=dev)[None, :] < n_part[:, None])[..., None]
        k_win = next(iter(self.window.values())).shape[-1]
        n_live = torch.tensor([counts[i] for i in live], device=dev)
        cols_at = (n_live[:, None] + torch.arange(k_win, device=dev))[:, None, :]
        for layer, (mixed, k, v, g, beta, final) in staged.items():
            state = self.state[layer]
            if full:   # in place: a captured step reads these buffers at every replay
                state[full_at] = final[full_ix]
            for n, (i, at) in whole_ix.items():
                state[at] = chunk_rule(k[i, :n], k[i, :n], v[i, :n], g[i, :n], beta[i, :n],
                                       state[at])[1]
            if part:
                i = part_ix
                gm = torch.where(keep, g[i, :n_max], torch.zeros((), dtype=g.dtype, device=dev))
                bm = torch.where(keep, beta[i, :n_max],
                                 torch.zeros((), dtype=beta.dtype, device=dev))
                state[part_at] = recurrent_rule(k[i, :n_max], k[i, :n_max], v[i, :n_max], gm,
                                                bm, state[part_at])[1]
            w = self.window[layer]
            cols = torch.cat([w[live_at], mixed[live_ix].transpose(1, 2).to(w.dtype)], dim=-1)
            w[live_at] = cols.gather(-1, cols_at.expand(-1, cols.shape[1], -1))

    @property
    def mark_length(self) -> int:
        return self._mark[0] if self._mark is not None else 0
