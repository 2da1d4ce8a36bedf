"""Memory entry fused-rmsnorm (option rmsnorm_impl): torch's one-kernel rms_norm in place of
the six eager ops, the same greedy tokens (fp32, CPU). Runs where the entry is applied
(tests/test_entry_tests.py replays it onto stock): the entry once reproduced its tree yet
failed at its first use (model.py had lost the RMSNorm import), which only running it shows."""

from __future__ import annotations

import pytest

from stock.options import REGISTRY, Options

if "rmsnorm_impl" not in REGISTRY:
    pytest.skip("option rmsnorm_impl comes with the memory entry fused-rmsnorm",
                allow_module_level=True)

from stock.config import PRESETS  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.layers import RMSNorm  # noqa: E402
from stock.model import Transformer  # noqa: E402


def test_fused_rmsnorm_gives_the_eager_norms_tokens():
    prompt = list(range(3, 40))
    outs = []
    for impl in ("eager", "fused"):
        model = Transformer.random(PRESETS["tiny-qwen3"], seed=2, std=0.08)
        model.configure(Options({"rmsnorm_impl": impl}))
        norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
        assert norms and all(m.fused == (impl == "fused") for m in norms)
        outs.append(Engine(model, Options(), 128).generate(prompt, 24).tokens)
    assert outs[0] == outs[1]
