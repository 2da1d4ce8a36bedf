"""What verifying more tokens costs on this CPU, and the cheaper way to write it: for the
embedded model's layer shapes (fp32, 2 threads), F.linear(x, W) against W @ x^T (the path
`stock.linear.linear` takes for 2..16 rows) by row count M. Weights are cycled over enough
copies (>= 64 MB) that they come from memory, not cache, as in a real step.

    python bench/cpu_linear_rows.py
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

SHAPES = {"q, o": (576, 576), "k, v": (576, 192), "gate, up": (576, 1536),
          "down": (1536, 576), "lm head": (576, 49152)}
MS = (1, 2, 4, 5, 8, 16)


def us_per_call(fn, ws, x, budget_s: float = 0.4) -> float:
    for w in ws[:2]:
        fn(x, w)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < budget_s or n < len(ws):
        fn(x, ws[n % len(ws)])
        n += 1
    return 1e6 * (time.perf_counter() - t0) / n


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32; "
          "µs per call, weights cycled from memory")
    paths = {"F.linear": lambda x, w: F.linear(x, w),
             "W @ x^T": lambda x, w: torch.mm(w, x.t()).t().contiguous()}
    print(f"{'layer':<10}{'K x N':>11}{'M':>4}" + "".join(f"{p:>12}" for p in paths)
          + f"{'ratio':>8}{'F.linear / M=1':>16}")
    for name, (k, n) in SHAPES.items():
        copies = max(2, (64 << 20) // (4 * k * n))
        ws = [torch.randn(n, k) for _ in range(copies)]
        base = None
        for m in MS:
            x = torch.randn(m, k)
            us = {p: us_per_call(f, ws, x) for p, f in paths.items()}
            base = base or us["F.linear"]
            print(f"{name:<10}{f'{k}x{n}':>11}{m:>4}" + "".join(f"{us[p]:>12.1f}" for p in paths)
                  + f"{us['F.linear'] / us['W @ x^T']:>8.2f}{us['F.linear'] / base:>16.2f}")


if __name__ == "__main__":
    main()
