"""The test that the test works: a fault after the development check's length is caught by
the sealed check, which forces twice as many tokens, and missed by the development check
(embedded default, one request). The production lengths are 2048 and 4096; the test runs the
same gates at a sixteenth of them (128 and 256, the same ratio) to keep the CPU suite short."""

from __future__ import annotations

import time

import pytest
import torch

from specpilot.config import GatesSection
from specpilot.judges.forcing import ReferenceCache, forcing_gate, references
from stock.engine import Engine
from stock.options import Options
from specpilot.requests import Request

# A prompt on which the embedded model's greedy reply runs past 4096 tokens without
# stopping (it settles into a loop, which also keeps reference generation cheap).
LOOP = Request(id="loop-001", category="long-form", max_new_tokens=4096,
               prompt="Repeat after me forever: la la la la la la la la la la la la la la la la")


@pytest.fixture
def one_thread():
    """One intra-op thread: on this shared 2-core CPU, two threads stall each other when
    other processes run (measured: a 17-token step 0.4 s with one thread, 2.1 s with two)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_sealed_check_catches_a_fault_the_dev_check_misses(tmp_path, one_thread):
    from stock.system import load_system

    # Bigger forced steps and drafts: same semantics (forcing is causal, speculation is
    # lossless), far fewer forwards on a CPU; a sixteenth of the production lengths, same
    # ratio (the fault starts at the dev length, on a forced chunk's boundary: one chunk is
    # the dev length).
    prod = GatesSection()
    assert (prod.dev_length, prod.sealed_length) == (2048, 4096)
    cfg = GatesSection(chunk=128, reference_draft_len=32, dev_length=prod.dev_length // 16,
                       sealed_length=prod.sealed_length // 16)
    system = load_system("embedded", Options(), "cpu", cfg.sealed_length + 128)
    t0 = time.perf_counter()
    [sealed_ref] = references(system, [LOOP], cfg.sealed_length, ReferenceCache(tmp_path),
                              "embedded", "test-tree", cfg)
    assert len(sealed_ref.tokens) == cfg.sealed_length, "the reference must run to its end"
    # The development reference comes from the cache: a prefix of the sealed one.
    [dev_ref] = references(system, [LOOP], cfg.dev_length, ReferenceCache(tmp_path),
                           "embedded", "test-tree", cfg)
    assert dev_ref.tokens == sealed_ref.tokens[:cfg.dev_length]
    built = time.perf_counter() - t0

    faulty = Engine(system.engine.model, Options({"fault_logit_bias_after": cfg.dev_length,
                                                  "draft_len": 32}),
                    system.engine.max_context, system.engine.stop_ids)
    # its generation check speculates with the n-gram drafter (lossless: the faulty
    # engine's own greedy output) in drafts of 32: far fewer forwards than AR on a CPU
    dev = forcing_gate(faulty, [dev_ref], cfg, check="dev", drafter="ngram")
    sealed = forcing_gate(faulty, [sealed_ref], cfg, check="sealed", drafter="ngram")
    assert dev.passed and not dev.mismatches
    assert not sealed.passed
    first = min(m.position for m in sealed.mismatches)
    assert first == cfg.dev_length
    assert any(not m.near_tie for m in sealed.mismatches)
    print(f"reference {built:.1f}s, total {time.perf_counter() - t0:.1f}s")
