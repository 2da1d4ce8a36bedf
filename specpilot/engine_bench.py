"""`specpilot bench`: modes of the stock engine side by side on one request set, one run.

Modes: `ar` (autoregressive), `spec` (speculative with the chosen drafter), a drafter's
name (`ngram`, `draft`), and `hf` (transformers' `generate()` on the same weights and
thread count, as an outside anchor). Each request runs every mode back to back, so slow
drift of the machine hits all modes alike.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
from pydantic import BaseModel

from specpilot.requests import Request
from stock.system import DRAFTERS, System

SCHEMA_VERSION = 1


class ModeResult(BaseModel):
    mode: str
    requests: int = 0
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0  # verification steps (prefill not counted)
    accepted: int = 0  # tokens gained by those steps, bonus included
    decode_seconds: float = 0.0
    per_request_tok_s: list[float] = []
    identical_to_ar: int | None = None  # requests whose tokens equal AR's

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    def summary(self, ar: "ModeResult | None") -> dict:
        out = {
            "mode": self.mode,
            "requests": self.requests,
            "tokens": self.tokens,
            "tokens_per_s": round(self.tokens_per_s, 3),
            "median_request_tok_s": round(statistics.median(self.per_request_tok_s), 3)
            if self.per_request_tok_s else None,
            "tau": round(self.accepted / self.steps, 3) if self.steps else None,
            "step_ms": round(1e3 * self.decode_seconds / self.steps, 3) if self.steps else None,
            "identical_to_ar": self.identical_to_ar,
        }
        if ar is not None and ar.tokens:
            out["speedup_vs_ar"] = round(self.tokens_per_s / ar.tokens_per_s, 3)
        return out


class BenchReport(BaseModel):
    schema_version: int = SCHEMA_VERSION
    model: str
    device: str
    dtype: str
    threads: int
    max_new: int
    options: dict
    modes: list[dict]


def parse_modes(text: str, drafter: str) -> list[str]:
    modes = []
    for m in (x.strip() for x in text.split(",") if x.strip()):
        m = drafter if m == "spec" else m
        if m not in ("ar", "hf", *DRAFTERS):
            raise ValueError(f"unknown mode {m!r}; known: ar, spec, hf, {', '.join(DRAFTERS)}")
        if m not in modes:
            modes.append(m)
    if not modes:
        raise ValueError("no modes given")
    return modes


def _hf_runner(system: System) -> Callable[[list[int], int], tuple[list[int], float]]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(system.folder), dtype=system.engine.model.dtype)
    hf = hf.to(system.device).eval()

    def run(prompt: list[int], max_new: int):
        ids = torch.tensor([prompt], device=system.device)
        t0 = time.perf_counter()
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                          do_sample=False, eos_token_id=sorted(system.engine.stop_ids) or None,
                          pad_token_id=0)
        return out[0, len(prompt):].tolist(), time.perf_counter() - t0

    return run


def run_bench(system: System, requests: list[Request], modes: list[str], max_new: int,
              progress: Callable[[str], None] = lambda _: None) -> BenchReport:
    results = {m: ModeResult(mode=m) for m in modes}
    hf = _hf_runner(system) if "hf" in modes else None

    def generate(prompt, n, mode):
        return system.engine.generate(prompt, n, system.drafter(None if mode == "ar" else mode))

    if system.engine.uses_graphs:
        # untimed first: a step's first use of a shape captures a CUDA graph and, with stock's
        # `compile` option, its first use of a T compiles the layers (seconds a T)
        for req in requests:
            prompt = system.tokenizer.chat(req.prompt)
            for mode in modes:
                if mode != "hf":
                    progress(f"warm-up {req.id} {mode}")
                    generate(prompt, min(max_new, req.max_new_tokens), mode)
    for req in requests:
        prompt = system.tokenizer.chat(req.prompt)
        n = min(max_new, req.max_new_tokens)
        ar_tokens = None
        for mode in modes:
            progress(f"{req.id} {mode}")
            r = results[mode]
            if mode == "hf":
                tokens, secs = hf(prompt, n)
            else:
                res = generate(prompt, n, mode)
                tokens, secs = res.tokens, res.prefill_s + res.decode_s
                r.steps += res.steps
                r.accepted += sum(res.accepted)
                r.decode_seconds += res.decode_s
            r.requests += 1
            r.tokens += len(tokens)
            r.seconds += secs
            r.per_request_tok_s.append(len(tokens) / max(secs, 1e-9))
            if mode == "ar":
                ar_tokens = tokens
            elif ar_tokens is not None:
                r.identical_to_ar = (r.identical_to_ar or 0) + int(tokens == ar_tokens)
    ar = results.get("ar")
    model = system.engine.model
    return BenchReport(model=system.folder.name, device=str(system.device), dtype=str(model.dtype),
                       threads=torch.get_num_threads(), max_new=max_new,
                       options=system.options.as_dict(),
                       modes=[results[m].summary(ar) for m in modes])
