"""What verifying more tokens costs on this CPU: F.linear time by row count M for the
embedded model's layer shapes (fp32, 2 threads, weights resident in cache).

    python bench/cpu_linear_rows.py
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

SHAPES = {"mlp up/gate": (576, 1536), "mlp down": (1536, 576), "lm head": (576, 49152)}


def main() -> None:
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32")
    print(f"{'layer':<12}{'K x N':>12}" + "".join(f"{'M=' + str(m) + ' us':>12}" for m in (1, 2, 4, 16))
          + f"{'M=4 / M=1':>11}")
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k)
        us = {}
        for m in (1, 2, 4, 16):
            x = torch.randn(m, k)
            for _ in range(10):
                F.linear(x, w)
            reps = 20 if n > 10000 else 200
            t0 = time.perf_counter()
            for _ in range(reps):
                F.linear(x, w)
            us[m] = 1e6 * (time.perf_counter() - t0) / reps
        print(f"{name:<12}{f'{k}x{n}':>12}" + "".join(f"{us[m]:>12.1f}" for m in us)
              + f"{us[4] / us[1]:>11.2f}")


if __name__ == "__main__":
    main()
