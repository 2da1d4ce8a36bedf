"""Plain-PyTorch gated delta rule and short causal conv (any device, fp32 math).

Shapes, per sequence batch B and T new tokens:

- q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; Hv a multiple of Hk (value head h reads key head
  h // (Hv // Hk)); q and k are L2-normalised here (eps 1e-6) and q scaled by Dk^-1/2;
- g [B, T, Hv]: the log decay (<= 0), beta [B, T, Hv] in (0, 1);
- state [B, Hv, Dk, Dv] fp32: the recurrent state before the first token (zeros if None).

Per value head and token t: S <- exp(g_t) S; S <- S + beta_t k_t (v_t - S^T k_t)^T;
o_t = S^T q_t. `recurrent_reference` runs that loop (the oracle, and the replay that
advances a committed state); `chunk_reference` computes the same over chunks of C tokens
in matrix form: with G the cumulative log decay inside a chunk, the corrections
D = (I + A)^-1 (beta V - beta e^G K S0), A[t, j] = beta_t e^(G_t - G_j) k_t.k_j for j < t,
outputs e^G Q S0 + (causal e^(G_t - G_j) q_t.k_j) D, and the state after the chunk
e^(G_C) S0 + (e^(G_C - G) K)^T D. Both return (outputs [B, T, Hv, Dv] in v's dtype, the
state after the last token, fp32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prepare(q, k, v, g, beta, state):
    """fp32, heads first ([B, Hv, T, D]), keys and queries per value head, normalised."""
    hv, hk = v.shape[2], k.shape[2]
    if hv % hk:
        raise ValueError(f"{hv} value heads are not a multiple of {hk} key heads")
    rep = hv // hk
    q, k = (l2norm(x.float()).repeat_interleave(rep, dim=2).transpose(1, 2) for x in (q, k))
    q = q * q.shape[-1] ** -0.5
    v = v.float().transpose(1, 2)
    g, beta = g.float().transpose(1, 2), beta.float().transpose(1, 2)
    b, _, _, dk = q.shape
    s0 = (torch.zeros(b, hv, dk, v.shape[-1], device=v.device) if state is None
          else state.float())
    return q, k, v, g, beta, s0


def recurrent_reference(q, k, v, g, beta, state=None):
    dtype = v.dtype
    q, k, v, g, beta, s = _prepare(q, k, v, g, beta, state)
    out = torch.empty_like(v)
    for t in range(v.shape[2]):
        s = s * g[:, :, t, None, None].exp()
        kt = k[:, :, t]
        delta = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", s, kt))
        s = s + kt[..., :, None] * delta[..., None, :]
        out[:, :, t] = torch.einsum("bhkv,bhk->bhv", s, q[:, :, t])
    return out.transpose(1, 2).to(dtype), s


def chunk_reference(q, k, v, g, beta, state=None, chunk: int = 64):
    dtype = v.dtype
    q, k, v, g, beta, s = _prepare(q, k, v, g, beta, state)
    t_all = v.shape[2]
    out = torch.empty_like(v)
    for c0 in range(0, t_all, chunk):
        sl = slice(c0, min(c0 + chunk, t_all))
        qc, kc, vc, bc = q[:, :, sl], k[:, :, sl], v[:, :, sl], beta[:, :, sl]
        gc = g[:, :, sl].cumsum(-1)                                   # [B, H, C]
        n = gc.shape[-1]
        diff = gc[..., :, None] - gc[..., None, :]                     # G_t - G_j
        lower = torch.ones(n, n, dtype=torch.bool, device=v.device).tril()
        decay = diff.masked_fill(~lower, float("-inf")).exp()          # 0 above the diagonal
        a = (bc[..., :, None] * (kc @ kc.transpose(-1, -2)) * decay).tril(-1)
        eye = torch.eye(n, device=v.device).expand_as(a)
        rhs = bc[..., None] * (vc - (gc.exp()[..., None] * kc) @ s)   # beta (V - e^G K S0)
        d = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        out[:, :, sl] = (gc.exp()[..., None] * qc) @ s + ((qc @ kc.transpose(-1, -2)) * decay) @ d
        last = gc[..., -1:]
        s = last.exp()[..., None] * s + ((last - gc).exp()[..., None] * kc).transpose(-1, -2) @ d
    return out.transpose(1, 2).to(dtype), s


def causal_conv_reference(x: torch.Tensor, window: torch.Tensor | None,
                          weight: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv of x [B, T, C] after `window` [B, C, K-1] (the inputs before
    the first token; zeros if None) with weight [C, K], then SiLU: [B, T, C] in x's dtype."""
    b, t, c = x.shape
    kw = weight.shape[-1]
    if window is None:
        window = x.new_zeros(b, c, kw - 1)
    full = torch.cat([window.to(x.dtype), x.transpose(1, 2)], dim=-1)
    out = F.conv1d(full.to(weight.dtype), weight.unsqueeze(1), groups=c)   # [B, C, T]
    return F.silu(out).transpose(1, 2).to(x.dtype)
