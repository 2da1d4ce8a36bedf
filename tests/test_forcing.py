"""Correctness gates: references, option-default gate, token forcing, near-tie tolerance."""

from __future__ import annotations

import pytest
import torch

from specpilot.config import GatesSection
from specpilot.errors import SpecPilotError
from specpilot.judges.forcing import (ReferenceCache, compute_reference, forcing_gate,
                               option_default_gate, references)
from stock.config import PRESETS
from stock.engine import Engine
from stock.model import Transformer
from stock.options import Options
from specpilot.requests import load_dev, select

CFG = GatesSection(chunk=9, default_tokens=24)


@pytest.fixture(scope="module")
def tiny():
    return Transformer.random(PRESETS["tiny-qwen3"], seed=1)


@pytest.fixture(scope="module")
def tiny_ref(tiny):
    return compute_reference(Engine(tiny, Options(), 512), list(range(1, 20)), "r1", 120,
                             "tiny", "tree-a", CFG)


def test_reference_is_stock_greedy_output_and_self_consistent(tiny, tiny_ref):
    ar = Engine(tiny, Options(), 512).generate(list(range(1, 20)), 120)
    assert tiny_ref.tokens == ar.tokens
    assert len(tiny_ref.margins) == len(tiny_ref.digests) == len(tiny_ref.tokens) == 120
    assert all(m >= 0 for m in tiny_ref.margins)


def test_reference_cache_keys_and_prefixes(tmp_path, tiny_ref):
    cache = ReferenceCache(tmp_path)
    assert cache.get("tiny", "tree-a", "r1", 50) is None
    cache.put(tiny_ref)
    short = cache.get("tiny", "tree-a", "r1", 54)   # 6 forced chunks of 9: a clean prefix
    assert short.tokens == tiny_ref.tokens[:54] and short.length == 54
    assert short.digests == tiny_ref.digests[:54]
    # 50 ends inside a chunk: its forced pass's last chunk is a forward of another shape,
    # so the 120-token reference's logits there are not what it computes bit for bit
    assert cache.get("tiny", "tree-a", "r1", 50) is None
    assert cache.get("tiny", "tree-a", "r1", 121) is None  # longer than cached: recompute
    assert cache.get("tiny", "tree-b", "r1", 50) is None  # another stock tree
    assert cache.get("other", "tree-a", "r1", 50) is None  # another model
    assert cache.get("tiny", "tree-a", "r2", 50) is None  # another request


def test_forcing_gate_passes_stock_and_fails_a_fault(tiny, tiny_ref):
    assert forcing_gate(Engine(tiny, Options(), 512), [tiny_ref], CFG).passed
    bad = forcing_gate(Engine(tiny, Options({"fault_logit_bias_after": 60}), 512), [tiny_ref], CFG)
    assert not bad.passed
    assert min(m.position for m in bad.mismatches) == 60
    assert all(m.position >= 60 for m in bad.mismatches)


def test_near_tie_mismatches_are_tolerated_only_up_to_the_rate(tiny, tiny_ref):
    faulty = Engine(tiny, Options({"fault_logit_bias_after": 110}), 512)
    found = forcing_gate(faulty, [tiny_ref], CFG).mismatches
    assert found
    ties = list(tiny_ref.margins)
    for m in found:  # pretend stock was nearly tied exactly where the candidate differs
        ties[m.position] = 0.0
    tied_ref = tiny_ref.model_copy(update={"margins": ties})
    strict = forcing_gate(faulty, [tied_ref], CFG.model_copy(update={"near_tie_rate": 0.0}))
    loose = forcing_gate(faulty, [tied_ref], CFG.model_copy(update={"near_tie_rate": 0.5}))
    assert all(m.near_tie for m in strict.mismatches)
    assert not strict.passed and loose.passed


def test_exact_mode_and_option_default_gate_see_a_tiny_logit_change(tiny, tiny_ref):
    assert option_default_gate(Engine(tiny, Options(), 512), [tiny_ref], CFG).passed
    nudged = Transformer.random(PRESETS["tiny-qwen3"], seed=1)
    with torch.no_grad():
        nudged.model.norm.weight[0] += 1e-4  # same argmax almost surely, other logits
    loose = forcing_gate(Engine(nudged, Options(), 512), [tiny_ref], CFG)
    exact = forcing_gate(Engine(nudged, Options(), 512), [tiny_ref], CFG, exact=True)
    default = option_default_gate(Engine(nudged, Options(), 512), [tiny_ref], CFG)
    assert not exact.passed and exact.logit_differences == {"r1": 0}
    assert not default.passed
    assert loose.passed or loose.mismatches  # loose judges tokens only
    with pytest.raises(SpecPilotError):
        option_default_gate(Engine(tiny, Options({"draft_len": 3}), 512), [tiny_ref], CFG)


def test_stock_passes_both_gates_and_a_large_margin_change_fails(smol, tmp_path):
    # 12 tokens: the fault starts at 10, inside the second forced chunk of 9 (9..11), and
    # the gates' AR generation checks (two a gate) are most of this test's time on a CPU
    reqs = select(load_dev(), None, 1)[:2]
    refs = references(smol, reqs, 12, ReferenceCache(tmp_path), "embedded", "t", CFG)
    assert [len(r.tokens) for r in refs] == [12, 12]
    engine = smol.engine
    stock = Engine(engine.model, Options(), engine.max_context, engine.stop_ids)
    default = option_default_gate(stock, refs, CFG)
    assert default.passed
    # the default gate is the exact forcing gate plus its own generation: its report is
    # the exact gate's (bit-identical logits on every request), not a second exact pass
    assert default.exact and not default.logit_differences and default.tokens_checked == 24
    assert forcing_gate(stock, refs, CFG).passed
    biased = Engine(engine.model, Options({"fault_logit_bias_after": 10}), engine.max_context,
                    engine.stop_ids)
    rep = forcing_gate(biased, refs, CFG)
    assert not rep.passed
    hard = [m for m in rep.mismatches if not m.near_tie]
    assert hard and hard[0].position == 10 and hard[0].reference_margin > CFG.near_tie_epsilon


def test_stock_is_judged_by_its_forced_choice_not_by_what_its_generation_emitted(tiny,
                                                                                 tiny_ref):
    """bf16 generation can emit the other token of an exact tie; its forced pass (the gate's
    procedure) is what stock chooses there. Build such a reference on CPU: the generation
    'emitted' another token at position 40, and stock's forced pass over those tokens is the
    reference's argmax. Stock itself must pass, and a real fault must still fail."""
    k = 40
    other = (tiny_ref.tokens[k] + 1) % PRESETS["tiny-qwen3"].vocab_size
    prefix = list(tiny_ref.tokens[:k]) + [other]
    rest = len(tiny_ref.tokens) - k - 1   # the generation went on from what it emitted
    tokens = prefix + Engine(tiny, Options(), 512).generate(tiny_ref.prompt_ids + prefix,
                                                            rest).tokens
    forced = Engine(tiny, Options(), 512).force(tiny_ref.prompt_ids, tokens, chunk=CFG.chunk)
    assert forced.argmax[k] != tokens[k]   # stock would not have emitted it
    margins = list(forced.margin)
    margins[k] = 0.0                       # an exact tie of the rounded logits
    ref = tiny_ref.model_copy(update={"tokens": tokens, "argmax": forced.argmax,
                                      "margins": margins, "digests": []})
    ok = forcing_gate(Engine(tiny, Options(), 512), [ref], CFG)
    assert ok.passed and not ok.mismatches
    bad = forcing_gate(Engine(tiny, Options({"fault_logit_bias_after": 60}), 512), [ref], CFG)
    assert not bad.passed and min(m.position for m in bad.mismatches) == 60
