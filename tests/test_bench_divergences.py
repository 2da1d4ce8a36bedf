"""bench/batch_throughput.py's reading of outputs that differ from the single-request
reference: where each one parts from it, stock's margin there, and whether that is a
near-tie by the judges' own rule (tiny random target, fp32, CPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

bt = pytest.importorskip("batch_throughput")

from specpilot.config import GatesSection  # noqa: E402
from stock.config import PRESETS  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.model import Transformer  # noqa: E402
from stock.options import Options  # noqa: E402


def test_the_bench_uses_the_judges_near_tie_rule():
    gates = GatesSection()
    assert (bt.NEAR_TIE_EPSILON, bt.NOISE_FACTOR) == (gates.near_tie_epsilon,
                                                       gates.noise_factor)


def test_divergences_name_the_position_and_the_reference_margin():
    net = Transformer.random(PRESETS["tiny-qwen3"], torch.device("cpu"), torch.float32, seed=0)
    eng = Engine(net, Options({"draft_len": 3}), 96)
    gen = torch.Generator().manual_seed(3)
    reqs = [(torch.randint(1, net.cfg.vocab_size, (12,), generator=gen).tolist(), 16)
            for _ in range(3)]
    ref = {i: eng.generate(p, m).tokens for i, (p, m) in enumerate(reqs)}
    margins = bt.Margins(eng, reqs, ref)
    forced = eng.force(reqs[1][0], ref[1], chunk=16)
    p_low = min(range(16), key=forced.margin.__getitem__)    # the closest call
    p_high = max(range(16), key=forced.margin.__getitem__)   # the surest one

    def other(p):   # any other token there: the verdict reads stock's margin, not the token
        return ref[1][:p] + [(ref[1][p] + 1) % net.cfg.vocab_size]

    outs = [list(ref[0]), other(p_low), ref[2] + [7]]
    d = bt.divergences(outs, ref, margins)
    assert d["differ"] == 2 and d["epsilon"] >= bt.NEAR_TIE_EPSILON
    low = forced.margin[p_low]
    assert margins.at(1, p_low) == pytest.approx(low, abs=1e-5)
    assert (1, p_low, pytest.approx(low, abs=1e-5)) in d["beyond"] or low <= d["epsilon"]
    assert (2, 16, None) in d["beyond"]             # longer than its reference: never a tie
    assert d["near_ties"] == (1 if low <= d["epsilon"] else 0)
    # the same request parting where stock was surest: beyond, at its margin
    d = bt.divergences([ref[0], other(p_high), ref[2]], ref, margins)
    assert forced.margin[p_high] > d["epsilon"]      # fp32: stock's noise is ~1e-6
    part = [(1, p_high, pytest.approx(forced.margin[p_high], abs=1e-5))]
    assert d == {"differ": 1, "near_ties": 0, "epsilon": d["epsilon"], "beyond": part,
                 "found": part}
    # widened by stock's own batching as the controller widens it (fold_batch_noise): twice
    # the largest margin at which stock's batched AR parted; a parting above that stays beyond
    m = forced.margin[p_high]
    outs = [ref[0], other(p_high), ref[2]]
    wide = bt.divergences(outs, ref, margins, batching=m / 2)
    assert wide["epsilon"] == pytest.approx(max(d["epsilon"], m))
    assert wide["near_ties"] == 1 and wide["beyond"] == []
    narrow = bt.divergences(outs, ref, margins, batching=m / 2.5)
    assert narrow["near_ties"] == 0 and narrow["beyond"] == part


def test_a_run_without_the_single_request_row_prints_its_table(tmp_path):
    """Concurrencies without C = 1 (so no single-request AR reference): the outputs are not
    compared, the table still prints (it once failed looking up the missing reference)."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, str(root / "bench" / "batch_throughput.py"),
                          "--smoke", "--conc", "2", "--modes", "ar", "--repeats", "1"],
                         cwd=root, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OUT": str(tmp_path)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "outputs not compared" in res.stdout
    assert "| ar | 2 |" in res.stdout


def test_no_compare_skips_the_single_request_reference(tmp_path):
    """--no-compare: no single-request reference run (at C = 128 on the 27B-class target it
    is 256 requests one at a time) and no "= single AR" count; without it the run is
    announced and the rows are counted."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    runs = {}
    for flags in ((), ("--no-compare",)):
        res = subprocess.run([sys.executable, "bench/batch_throughput.py", "--smoke",
                              "--modes", "ar", *flags], cwd=root, env=env,
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        rows = [ln.split("|")[1:-1] for ln in res.stdout.splitlines()
                if ln.startswith("| ar |")]
        rows = [r for r in rows if len(r) == 13]   # the first table's (its last: = single AR)
        runs[flags] = (res.stdout + res.stderr, [r[-1].strip() for r in rows])
    log, same = runs[()]
    assert "the single-request reference:" in log and all("/" in s for s in same), same
    log, same = runs[("--no-compare",)]
    assert "the single-request reference" not in log and same and set(same) == {"-"}, same


def test_each_mode_is_compared_with_the_ar_mode_sharing_its_options():
    modes = ["ar", "ar:admit_min=4+prefill_tokens=256", "block:draft_len=7",
             "block:draft_len=7+admit_min=4+prefill_tokens=256", "block:admit_min=2"]
    assert bt.ar_of("block:draft_len=7", modes) == "ar"
    assert (bt.ar_of("block:draft_len=7+admit_min=4+prefill_tokens=256", modes)
            == "ar:admit_min=4+prefill_tokens=256")
    assert bt.ar_of("ar:admit_min=4+prefill_tokens=256", modes) == modes[1]
    assert bt.ar_of("block:admit_min=2", modes) == "ar"   # no AR mode at admit_min 2
    assert bt.ar_of("block", ["block", "ar:admit_min=4"]) is None
