"""The GDN mixing a step runs: flash-linear-attention's Triton kernels on CUDA where the
package is installed (PyPI `flash-linear-attention`), else the plain-PyTorch reference.
Same contract as reference.py (q and k normalised inside, state fp32). fla's kernels run
their fp32 products in TF32 (Triton's default): against the fp32 reference they agree to
about 1e-3 relative, not 1e-5 (tests/gpu/test_gpu_hybrid.py)."""

from __future__ import annotations

import importlib.util

import torch

from kernels.gdn.reference import causal_conv_reference, chunk_reference, recurrent_reference


def fla_available() -> bool:
    return importlib.util.find_spec("fla") is not None


def _use_fla(x: torch.Tensor) -> bool:
    return x.is_cuda and fla_available()


# With fla, T tokens at once up to this many run fla's fused recurrent kernel (one launch,
# the tokens in order, the state in registers) instead of its chunked one (about nine
# launches: cumsum, l2norms, kkt, triangular solve, WY, states, outputs); a verify step of
# T tokens then rounds as T AR steps do. 16: on the H200, hybrid-27b's compiled verify
# steps with it against the chunked kernel (`bench/step_hybrid.py --recurrent-max-t 1,64`,
# 2026-12-05): T = 8 1.047x faster, 16 1.023x, 32 0.979x, 64 0.914x (slower).
RECURRENT_MAX_T = 16


def chunk_rule(q, k, v, g, beta, state=None, recurrent_max_t: int | None = None):
    """Prefill and verify steps (T tokens at once); with fla, T <= recurrent_max_t
    (default RECURRENT_MAX_T, read at each call) runs `recurrent_rule`."""
    if _use_fla(v):
        limit = RECURRENT_MAX_T if recurrent_max_t is None else recurrent_max_t
        if v.shape[1] <= limit:
            return recurrent_rule(q, k, v, g, beta, state)
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # lazy: optional package

        # q, k: Hk heads, v: Hv (fla's grouped value heads, Hv a multiple of Hk)
        out, final = chunk_gated_delta_rule(q, k, v, g=g.float(), beta=beta,
                                            initial_state=state, output_final_state=True,
                                            use_qk_l2norm_in_kernel=True)
        return out, final.float()
    return chunk_reference(q, k, v, g, beta, state)


def recurrent_rule(q, k, v, g, beta, state=None):
    """Token by token: AR steps, and the replay of an accepted prefix at commit."""
    if _use_fla(v):
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule  # lazy: optional

        # by keyword: fla's positional order is (q, k, v, g, gk, gv, beta, ...)
        out, final = fused_recurrent_gated_delta_rule(q, k, v, g=g.float(), beta=beta,
                                                      initial_state=state,
                                                      output_final_state=True,
                                                      use_qk_l2norm_in_kernel=True)
        return out, final.float()
    return recurrent_reference(q, k, v, g, beta, state)


def causal_conv(x, window, weight):
    return causal_conv_reference(x, window, weight)
