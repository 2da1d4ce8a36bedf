"""Correctness: reference outputs, the option-default gate and the token-forcing gate.

Reference: stock's greedy output for a request at full precision (fp32 on CPU), computed
with stock's lossless speculative decoding (ngram drafter; greedy speculative output equals
greedy autoregressive output), then one forced pass of stock over it recording, per
position, stock's argmax, its top-1 minus top-2 margin and a hash of its logits. Cached
keyed by model, stock tree hash, request id and length (`ReferenceCache.for_check`): the
dev requests' under .specpilot/cache/references/, the sealed requests' outside the
repository, beside the secret seed (requests/sealed.references_dir: folders 0700, files
0600), so no worktree can read a sealed prompt or output. A longer entry (or one that
stopped early) serves a shorter length whose forced pass ends on a chunk boundary of its
own (`Reference.cuts_exactly`).

Gates (each returns a GateReport; `passed` is the verdict):
- option-default: a candidate with every option at its default must give stock's logits bit
  for bit at every forced position and the reference's tokens when generating;
- token forcing: the candidate runs with the reference tokens forced; every position where
  its own choice differs is a mismatch, reported with the reference margin. Mismatches at
  near-ties (margin <= epsilon) are tolerated up to a rate; any other mismatch fails.
  In bf16 epsilon and the rate widen to stock's own measured noise (outputs.tolerance).
  `exact` demands bit-identical logits instead.
Development checks force up to gates.dev_length new tokens, the sealed check sealed_length.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from specpilot.config import GatesSection
from specpilot.errors import SpecPilotError
from specpilot.judges.outputs import (Expected, OutputCheck, Tolerance, check_request,
                                      near_tie_budget, tolerance)
from specpilot.requests.sealed import private_dir, references_dir, write_private
from specpilot.judges.worker_main import reference_pass

SCHEMA_VERSION = 2   # 2: stock's noise pass (noise, noise_flips)
REFS_DIR = Path(".specpilot") / "cache" / "references"   # the dev requests' references
SEALED_PREFIX = "sealed-"   # the judges' sealed request ids (requests/sealed, gates)


class Reference(BaseModel):
    schema_version: int = SCHEMA_VERSION
    model: str
    stock_tree: str
    request_id: str
    length: int                 # the budget asked for; tokens may be shorter (a stop)
    prompt_ids: list[int]
    tokens: list[int]
    stop_reason: str
    chunk: int                  # tokens per step of the forced pass below
    argmax: list[int]           # stock's own choice at each forced position
    margins: list[float]        # stock's top-1 minus top-2 logit at each position
    digests: list[str]          # hash of stock's fp32 logits at each position
    noise: list[float] = []     # how far stock's own step shapes move each margin (bf16)
    noise_flips: list[int] = [] # positions whose argmax that alone flipped

    def cuts_exactly(self, length: int) -> bool:
        """Is the prefix for `length` what a forced pass of that length computes, bit for bit?
        Only if it ends on a chunk boundary of the forced pass (or takes every token): a
        partial last chunk is a forward of another shape, whose logits differ in the last
        bits (on the tiny test model at the first position of the cut chunk)."""
        n = min(length, len(self.tokens))
        return n == len(self.tokens) or n % self.chunk == 0

    def cut(self, length: int) -> "Reference":
        """The same reference for a smaller budget (a prefix of it)."""
        if length >= self.length:
            return self
        n = min(length, len(self.tokens))
        stop = "length" if n < len(self.tokens) or self.stop_reason == "length" else self.stop_reason
        return self.model_copy(update=dict(
            length=length, tokens=self.tokens[:n], argmax=self.argmax[:n],
            margins=self.margins[:n], digests=self.digests[:n], noise=self.noise[:n],
            noise_flips=[i for i in self.noise_flips if i < n], stop_reason=stop))


class Mismatch(BaseModel):
    request_id: str
    position: int               # index among the new tokens
    candidate_token: int
    reference_token: int
    reference_margin: float
    near_tie: bool


class GateReport(BaseModel):
    schema_version: int = SCHEMA_VERSION
    gate: Literal["option-default", "forcing"]
    check: str                  # dev | sealed | custom
    length: int
    exact: bool
    requests: list[str]
    tokens_checked: int
    mismatches: list[Mismatch]
    near_ties_allowed: int
    logit_differences: dict[str, int]  # request -> first position whose logits differ
    generation: OutputCheck | None = None  # the candidate's generate() against the reference
    passed: bool
    reasons: list[str]


class ReferenceCache:
    """References in `folder`/<model>/<stock tree>/<request>@<length>.json; `private`:
    folders 0700 and files 0600 (the sealed requests')."""

    def __init__(self, folder: Path, private: bool = False):
        self.folder = Path(folder)
        self.private = private

    @classmethod
    def for_check(cls, root: Path, check: str) -> "ReferenceCache":
        """The cache of a check: the repository's for dev requests, the private folder
        beside the secret seed for sealed ones (any sealed reference an older version left
        in the repository is deleted)."""
        if check != "sealed":
            return cls(Path(root) / REFS_DIR)
        for old in (Path(root) / REFS_DIR).glob(f"*/*/{SEALED_PREFIX}*"):
            old.unlink(missing_ok=True)
        return cls(references_dir(), private=True)

    def _dir(self, model: str, stock_tree: str) -> Path:
        slug = hashlib.sha256(model.encode()).hexdigest()[:12]
        return self.folder / slug / stock_tree

    def get(self, model: str, stock_tree: str, request_id: str, length: int) -> Reference | None:
        folder = self._dir(model, stock_tree)
        if not folder.is_dir():
            return None
        for path in sorted(folder.glob(f"{request_id}@*.json"),
                           key=lambda p: int(p.stem.rsplit("@", 1)[1])):
            try:
                ref = Reference.model_validate_json(path.read_text())
            except ValueError:
                continue
            if ref.schema_version != SCHEMA_VERSION or ref.request_id != request_id:
                continue
            if (ref.length >= length or ref.stop_reason == "stop") and ref.cuts_exactly(length):
                return ref.cut(length)
        return None

    def put(self, ref: Reference) -> None:
        folder = self._dir(ref.model, ref.stock_tree)
        path = folder / f"{ref.request_id}@{ref.length}.json"
        if self.private:
            private_dir(folder.parent)
            private_dir(folder)
            write_private(path, ref.model_dump_json())
            return
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(ref.model_dump_json())
        tmp.replace(path)


def compute_reference(stock_engine, prompt_ids: list[int], request_id: str, length: int,
                      model: str, stock_tree: str, cfg: GatesSection) -> Reference:
    """Stock's reference in this process (tests, fault injection): the same computation as
    the judges' stock worker (`worker_main.reference_pass`)."""
    base = stock_engine.options.non_default()
    if base:
        raise SpecPilotError(f"the reference engine must be stock at defaults, has {base}")
    rep = reference_pass(stock_engine, prompt_ids, length, cfg.reference_draft_len, cfg.chunk)
    return Reference(model=model, stock_tree=stock_tree, request_id=request_id, length=length,
                     prompt_ids=list(prompt_ids), tokens=rep["tokens"],
                     stop_reason=rep["stop_reason"], chunk=cfg.chunk, argmax=rep["argmax"],
                     margins=rep["margin"], digests=rep["digests"], noise=rep["noise"],
                     noise_flips=rep["noise_flips"])


def references(stock_system, requests, length: int, cache: ReferenceCache, model: str,
               stock_tree: str, cfg: GatesSection) -> list[Reference]:
    """The reference of each request for `length` new tokens, from the cache or computed."""
    out = []
    for req in requests:
        ref = cache.get(model, stock_tree, req.id, length)
        if ref is None:
            ids = stock_system.tokenizer.chat(req.prompt)
            ref = compute_reference(stock_system.engine, ids, req.id, length, model,
                                    stock_tree, cfg)
            cache.put(ref)
        out.append(ref)
    return out


def forcing_gate(candidate_engine, refs: list[Reference], cfg: GatesSection,
                 exact: bool = False, check: str = "custom",
                 drafter: str | None = None) -> GateReport:
    """Force each reference through the candidate; judge its mismatches (or its logits).
    `drafter`: the generation check's, for an engine in this process (a worker's engine
    generates with its own)."""
    mismatches: list[Mismatch] = []
    differ: dict[str, int] = {}
    tokens = 0
    tol = gate_tolerance(refs, cfg)
    for ref in refs:
        if not ref.tokens:
            continue
        fr = candidate_engine.force(ref.prompt_ids, ref.tokens, chunk=ref.chunk, digests=exact)
        tokens += len(ref.tokens)
        # Stock's choice at each position is its argmax under the same forced procedure
        # (same tokens, same chunks), not the token its generation emitted: in bf16 a
        # generation verifies other chunk shapes, and at exact ties of the rounded logits it
        # can emit the other token. In fp32 the two agree (a test checks it).
        stock = ref.argmax or ref.tokens
        for i, (got, want) in enumerate(zip(fr.argmax, stock)):
            if got == want:
                continue
            margin = ref.margins[i]
            mismatches.append(Mismatch(request_id=ref.request_id, position=i,
                                       candidate_token=got, reference_token=want,
                                       reference_margin=margin,
                                       near_tie=margin <= tol.epsilon))
        if exact:
            first = next((i for i, (a, b) in enumerate(zip(fr.digests, ref.digests)) if a != b),
                         None)
            if first is not None:
                differ[ref.request_id] = first
    allowed = math.floor(tol.rate * tokens)
    generation = generation_check(candidate_engine, refs, cfg, drafter)
    reasons = list(generation.faults)
    hard = [m for m in mismatches if not m.near_tie]
    if exact:  # bit-identical logits is the whole criterion (it implies stock's choices)
        if differ:
            reasons.append(f"logits differ from stock on {len(differ)} request(s); first at "
                           + ", ".join(f"{k} position {v}" for k, v in differ.items()))
    elif hard:
        m = hard[0]
        reasons.append(f"{len(hard)} mismatch(es) beyond near-ties; first: {m.request_id} "
                       f"position {m.position} (reference margin {m.reference_margin:.3f})")
    ties = len(mismatches) - len(hard)
    if not exact and ties > allowed:
        reasons.append(f"{ties} near-tie mismatches exceed the {allowed} allowed "
                       f"({tol.rate:g} of {tokens} tokens)")
    return GateReport(gate="forcing", check=check, length=max((r.length for r in refs), default=0),
                      exact=exact, requests=[r.request_id for r in refs], tokens_checked=tokens,
                      mismatches=mismatches, near_ties_allowed=allowed, logit_differences=differ,
                      generation=generation, passed=not reasons, reasons=reasons)


def generation_check(candidate_engine, refs: list[Reference], cfg: GatesSection,
                     drafter: str | None = None) -> OutputCheck:
    """The candidate's own generation (the path the controller times) against each
    reference: force() reports what the candidate says it would choose, generate() is what
    it does. Near-ties are tolerated as in the controller (specpilot/judges/outputs.py).
    `drafter` (in-process engines only): generate with it, lossless, fewer forwards."""
    def gen(ids, n):
        own = None if drafter is None else own_drafter(drafter, candidate_engine)
        return candidate_engine.generate(ids, n, own).tokens

    check = OutputCheck(side="candidate")
    tol = gate_tolerance(refs, cfg)
    budget = near_tie_budget(sum(len(r.tokens) for r in refs), tol.rate)
    for ref in refs:
        if not ref.tokens:
            continue
        exp = Expected(request_id=ref.request_id, prompt_ids=ref.prompt_ids,
                       max_new=ref.length, tokens=ref.tokens, margins=ref.margins,
                       stop_reason=ref.stop_reason, noise=ref.noise,
                       noise_flips=ref.noise_flips)
        got = gen(ref.prompt_ids, ref.length)
        check_request(check, exp, got, lambda ids, n: (gen(ids, n), 0.0), tol.epsilon, budget)
    return check


def gate_tolerance(refs: list[Reference], cfg: GatesSection) -> Tolerance:
    """The gates' near-tie: configured, widened by stock's own noise (outputs.tolerance)."""
    return tolerance(refs, cfg.near_tie_epsilon, cfg.near_tie_rate, cfg.noise_factor)


def own_drafter(name: str, engine):
    """The drafter `name` of an engine in this process."""
    # lazy: stock.system imports torch (seconds); only the in-process gates need it
    from stock.system import make_drafter

    return make_drafter(name, engine)


def option_default_gate(candidate_engine, refs: list[Reference], cfg: GatesSection,
                        drafter: str = "ngram", check: str = "dev") -> GateReport:
    """All options at defaults: stock's logits bit for bit, and the reference's tokens."""
    changed = candidate_engine.options.non_default()
    if changed:
        raise SpecPilotError(f"the option-default gate needs every option at its default; "
                             f"set: {changed}")
    report = forcing_gate(candidate_engine, refs, cfg, exact=True, check=check)
    reasons = list(report.reasons)
    for ref in refs:
        n = min(cfg.default_tokens, len(ref.tokens))
        if n == 0:
            continue
        # an engine served by a worker (gates.WorkerEngine) generates with its own drafter
        own = None if getattr(candidate_engine, "remote", False) else \
            own_drafter(drafter, candidate_engine)
        got = candidate_engine.generate(ref.prompt_ids, n, own).tokens
        if got != ref.tokens[:n]:
            at = next((i for i, (a, b) in enumerate(zip(got, ref.tokens)) if a != b),
                      min(len(got), n))
            reasons.append(f"{ref.request_id}: generated tokens differ from stock's at {at}")
    return report.model_copy(update=dict(gate="option-default", reasons=reasons,
                                         passed=not reasons))
