"""`specpilot compare`, `specpilot gate` and `specpilot analyze`: the judges' doors."""

from __future__ import annotations

import sys

import click

from specpilot.commands.params import device_checked, devices_checked, warn_if_busy
from specpilot.config import find_root, load_config, require_root
from specpilot.cycle.types import options_text
from specpilot.errors import SpecPilotError
from specpilot.threads import noise_warning

EXIT_NOT_ADOPTED = 3
EXIT_GATE_FAILED = 4


def _pairs(values: tuple[str, ...], flag: str) -> dict[str, str]:
    out = {}
    for item in values:
        if "=" not in item:
            raise SpecPilotError(f"{flag}: expected name=value, got {item!r}", code=2)
        name, value = item.split("=", 1)
        out[name.strip()] = value.strip()
    return out


def _devices(text: str | None) -> list[str] | None:
    if not text:
        return None
    items = [d.strip() for d in text.split(",") if d.strip()]
    if all(d.isdigit() for d in items):
        import torch

        kind = "cuda" if torch.cuda.is_available() else "cpu"
        if kind == "cpu" and len(items) == 1:
            return ["cpu"]
        return devices_checked([f"{kind}:{d}" for d in items])
    return devices_checked(items)


_root = require_root


@click.command("compare")
@click.argument("a")
@click.argument("b", nargs=-1, required=True)
@click.option("--opt-a", multiple=True, metavar="NAME=VALUE", help="option for A (repeatable)")
@click.option("--opt-b", multiple=True, metavar="NAME=VALUE",
              help="option for B, for every candidate where several are given (repeatable)")
@click.option("--opt-of", multiple=True, nargs=2, metavar="REV NAME=VALUE",
              help="option for one candidate REV only (as given among B..; repeatable)")
@click.option("--devices", default=None,
              help="one device, or two run side by side: 0,1 (cuda if present, else one CPU "
                   "core each), or names such as cuda:0,cuda:1")
@click.option("--rounds", type=click.IntRange(min=2), default=None,
              help="measured rounds (config: controller.rounds)")
@click.option("--requests", "n_requests", type=click.IntRange(min=1), default=None,
              help="requests per round")
@click.option("--max-new", type=click.IntRange(min=1), default=None, help="new tokens per request")
@click.option("--request-set", default="fresh", show_default=True,
              help="fresh (new prompts from a secret seed every round), or a pool: dev, "
                   "sealed or a JSONL file, sampled without repeats")
@click.option("--sigma", type=click.FloatRange(min=0), default=None,
              help="a floor for σ: the bar uses the larger of this and the run's own σ")
@click.option("--family", type=click.IntRange(1), default=1, show_default=True,
              help="candidates judged together: the bound's level is 1 - (1 - confidence)/N "
                   "(at least the number of candidates given)")
@click.option("--model", default=None, help="model (default: config)")
@click.option("--drafter-a", default=None,
              help="A's drafter (default: config controller.drafter; ar for none)")
@click.option("--drafter-b", default=None, help="the candidates' drafter (default: A's)")
@click.option("--batch", type=click.IntRange(min=1), default=None, metavar="C",
              help="throughput mode: each round's requests served together by the batched "
                   "engine, at most C at once; the round's time is the statistic (default "
                   "2C requests a round, controller.min_pairs rounds)")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="R", help="with --batch: the requests arrive as a Poisson trace of R a "
                                "second (the same trace on both sides; default: all at once)")
@click.option("--json", "as_json", is_flag=True)
def compare_cmd(a, b, opt_a, opt_b, opt_of, devices, rounds, n_requests, max_new, request_set,
                sigma, family, model, drafter_a, drafter_b, batch, rate, as_json):
    """Paired benchmark of B against A (commits, or `stock` for HEAD). Several candidates
    (A B C ..) are judged in one run against one stock reference and one A side, each
    against A, one report each (--json: a list). Exit 0 if B (with several: any
    candidate) is adopted, 3 if not."""
    # lazy: CLI startup time (the judges import numpy and their workers' machinery)
    from specpilot.judges.controller import compare_many

    def progress(msg):   # stderr, with --json too: stdout carries only the report
        click.echo(f"  {msg}", err=True)

    shared = _pairs(opt_b, "--opt-b")
    own: dict[str, dict[str, str]] = {}
    for rev, item in opt_of:
        if rev not in b:
            raise SpecPilotError(f"--opt-of {rev}: not a candidate of this run "
                                 f"({', '.join(b)})", code=2)
        own.setdefault(rev, {}).update(_pairs((item,), "--opt-of"))
    if len(set(b)) != len(b):
        raise SpecPilotError(f"a candidate is given twice: {' '.join(b)}", code=2)
    warn_if_busy()
    reps = compare_many(_root(), a, [(rev, {**shared, **own.get(rev, {})}) for rev in b],
                        _pairs(opt_a, "--opt-a"), _devices(devices), rounds, model, n_requests,
                        max_new, sigma, request_set, progress, drafter_a=drafter_a,
                        drafter_b=drafter_b, family=family, batch=batch or 0,
                        rate=rate or 0.0)
    if as_json:
        click.echo(reps[0].model_dump_json(indent=1) if len(reps) == 1 else
                   "[" + ",\n".join(r.model_dump_json(indent=1) for r in reps) + "]")
    else:
        for n, rep in enumerate(reps):
            if len(reps) > 1:
                click.echo(("\n" if n else "") + f"candidate {n + 1} of {len(reps)}: "
                           f"{rep.b.rev}")
            _print_report(rep)
        if len(reps) > 1:   # one line a candidate, in the order given
            click.echo(f"\nsummary (family of {reps[0].family}: each against A, the bound "
                       f"at one-sided {reps[0].estimate.level:.2%})")
            width = max(len(rep.b.rev) for rep in reps)
            for rep in reps:
                click.echo(f"  {rep.b.rev:<{width}}  gain {rep.estimate.gain:+.2%}  lower "
                           f"bound {rep.estimate.lower_bound:+.2%}  threshold "
                           f"{rep.decision.threshold:.2%}  {rep.decision.verdict}"
                           + ("  (outputs differ from stock)" if rep.faults else ""))
    for rep in reps:
        noisy = noise_warning(rep.sigma, rep.decision.threshold)
        if noisy:
            click.echo(noisy, err=True)
            break
    sys.exit(0 if any(rep.decision.adopted for rep in reps) else EXIT_NOT_ADOPTED)


def _print_report(rep) -> None:
    """One comparison as `specpilot compare` prints it."""
    est, dec = rep.estimate, rep.decision
    method = f"t over worker processes, {est.df} df"
    level = f"{est.level * 100:.2f}".rstrip("0").rstrip(".") + "%"
    family_note = f", family of {est.family}" if est.family > 1 else ""
    wil = "n/a" if est.wilcoxon_p is None else f"{est.wilcoxon_p:.3g}"
    click.echo(f"A {rep.a.rev} ({rep.a.commit[:10]}, tree {rep.a.tree[:10]}) "
               f"options {options_text(rep.a.options)}, drafter {rep.drafter}")
    click.echo(f"B {rep.b.rev} ({rep.b.commit[:10]}, tree {rep.b.tree[:10]}) "
               f"options {options_text(rep.b.options)}, "
               f"drafter {rep.drafter_b or rep.drafter}")
    batched = (f"; throughput mode: each round one batch, at most {rep.batch} at once"
               + (f", Poisson arrivals at {rep.rate:g}/s" if rep.rate else
                  ", all arriving at its start")
               if rep.batch else "")
    click.echo(f"{rep.mode} on {', '.join(rep.devices)} ({rep.paired.hardware}); "
               f"{rep.processes} worker processes per side{batched}; {rep.rounds} rounds x "
               f"{len(rep.requests) // max(1, rep.rounds)} requests = {est.pairs} pairs per "
               f"process, "
               f"{rep.warmup_rounds} warm-up round(s) excluded; measured rounds took "
               f"{sum(rep.paired.round_wall_s):.1f} s")
    click.echo(f"workers confined   A {rep.a.confined}; B {rep.b.confined}")
    click.echo(f"gain of B over A   {est.gain:+.2%}")
    click.echo(f"lower bound        {est.lower_bound:+.2%}  (one-sided {level}{family_note}, "
               f"{method})")
    click.echo(f"Wilcoxon p         {wil}  (one-sided, B faster; over pairs, ignores "
               f"process offsets)")
    aa = ", ".join(f"{k} {v:+.2%}" for k, v in est.aa_gains.items())
    click.echo(f"same-side gains    {aa}")
    click.echo(f"noise sigma        {rep.sigma:.2%}  ({rep.sigma_source})")
    click.echo(f"threshold          {dec.threshold:.2%}"
               f"{'  (outputs diverge: raised bar)' if dec.diverged else ''}")
    for side, chk in rep.outputs.items():
        ties = f", {len(chk.near_ties)} near-tie(s) tolerated" if chk.near_ties else ""
        if chk.forced:   # throughput mode: stock forced through the outputs that parted
            ties += f", {chk.forced} checked by forcing stock through them"
        state = "match stock's" if chk.ok else f"FAULT: {chk.faults[0]}"
        click.echo(f"outputs {side}          {state} ({chk.requests} requests, "
                   f"{chk.tokens} tokens{ties})")
    click.echo(f"verdict            {dec.verdict}; B is {dec.direction}"
               f"{'; rejected: outputs differ from stock' if rep.faults else ''}")


@click.command("gate")
@click.option("--check", type=click.Choice(["dev", "sealed"]), default="dev", show_default=True,
              help="dev: dev requests, gates.dev_length tokens; sealed: the final check")
@click.option("--opt", "opts", multiple=True, metavar="NAME=VALUE", help="candidate option")
@click.option("--default", "default_gate", is_flag=True,
              help="the option-default gate (every option at its default) instead of forcing")
@click.option("--exact", is_flag=True, help="demand bit-identical logits")
@click.option("--requests", "n_requests", type=click.IntRange(min=1), default=None,
              help="how many requests")
@click.option("--length", type=click.IntRange(min=1), default=None,
              help="forced new tokens (default: config)")
@click.option("--candidate", default="HEAD", show_default=True, help="the candidate's commit")
@click.option("--base", default="HEAD", show_default=True,
              help="the commit whose stock computes the references")
@click.option("--device", default=None, callback=device_checked,
              help="cpu, cuda, cuda:1 (default: cuda if present)")
@click.option("--json", "as_json", is_flag=True)
def gate_cmd(check, opts, default_gate, exact, n_requests, length, candidate, base, device,
             as_json):
    """Correctness gates of a candidate commit against stock's cached reference outputs,
    each run in its own worker from a clean checkout. Exit 0 if it passes, 4 if it fails."""
    # lazy: CLI startup time (the judges import numpy and their workers' machinery)
    from specpilot.judges.gates import run_gate

    rep = run_gate(_root(), check, _pairs(opts, "--opt"), default_gate, exact, n_requests,
                   length, candidate, base, device,
                   progress=lambda msg: click.echo(f"  {msg}", err=True))   # stderr
    if as_json:
        click.echo(rep.model_dump_json(indent=1))
    else:
        click.echo(f"{rep.gate} gate, {rep.check} check: {len(rep.requests)} requests, "
                   f"{rep.tokens_checked} forced tokens (up to {rep.length} each)"
                   f"{', exact logits' if rep.exact else ''}")
        for m in rep.mismatches[:20]:
            click.echo(f"  mismatch {m.request_id} @{m.position}: {m.candidate_token} vs "
                       f"{m.reference_token}, reference margin {m.reference_margin:.4f}"
                       f"{' (near-tie)' if m.near_tie else ''}")
        if len(rep.mismatches) > 20:
            click.echo(f"  ... {len(rep.mismatches) - 20} more")
        if rep.generation is not None:
            g = rep.generation
            click.echo(f"  generation: {g.requests} requests through the candidate's own "
                       f"generate(), {len(g.near_ties)} near-tie(s) tolerated, "
                       f"{'matches stock' if g.ok else 'DIFFERS from stock'}")
        for reason in rep.reasons:
            click.echo(f"  FAIL: {reason}")
        click.echo("PASS" if rep.passed else "FAIL")
    sys.exit(0 if rep.passed else EXIT_GATE_FAILED)


@click.command("analyze")
@click.option("--requests", "n_requests", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--max-new", type=click.IntRange(min=1), default=48, show_default=True)
@click.option("--drafter", default="ngram", show_default=True)
@click.option("--model", default=None, help="model (default: config)")
@click.option("--device", default=None, callback=device_checked,
              help="cpu, cuda, cuda:1 (default: cuda if present)")
@click.option("--opt", "opts", multiple=True, metavar="NAME=VALUE",
              help="an engine option of the analysed system (repeatable; e.g. draft_len=15)")
@click.option("--opts-file", type=click.Path(), default=None, help="TOML file of options")
@click.option("--json", "as_json", is_flag=True)
def analyze_cmd(n_requests, max_new, drafter, model, device, opts, opts_file, as_json):
    """Cost model: τ, kernel and overhead factors, per-category measured vs bound."""
    # lazy: CLI startup time (the judges import numpy and their workers' machinery)
    from specpilot.judges.analyze import analyze

    root = find_root()
    cfg_model = model or load_config(root).model.path
    warn_if_busy()
    rep = analyze(root, cfg_model, device, n_requests, max_new, drafter, opts=opts,
                  opts_file=opts_file)
    if as_json:
        click.echo(rep.model_dump_json(indent=1))
        return
    hw = rep.hardware
    click.echo(f"{rep.model} on {rep.device} ({hw.name}, {rep.dtype}); peak "
               f"{hw.peak_flops(rep.dtype) / 1e12:.2f} TFLOP/s, {hw.bandwidth / 1e9:.1f} GB/s")
    click.echo(f"  source: {hw.source}")
    if hw.conditions:
        click.echo(f"  measured: {hw.conditions}")
    verified = "tokens verified per step not recorded (the system refused lattice logs)" \
        if rep.tokens_per_step is None else f"{rep.tokens_per_step:.2f} tokens verified per step"
    click.echo(f"{len(rep.requests)} requests, {rep.steps} steps, {verified}, mean context "
               f"{rep.mean_context:.0f}")
    click.echo(f"{'category':<10} {'measured ms':>12} {'bound ms':>10} {'ratio':>8}")
    for row in rep.categories:
        bound = "" if row.bound_ms is None else f"{row.bound_ms:.4f}"
        ratio = "" if row.ratio is None else f"{row.ratio:.1f}x"
        click.echo(f"{row.category:<10} {row.measured_ms:>12.3f} {bound:>10} {ratio:>8}")
    click.echo(f"actual step {rep.actual_step_ms:.2f} ms; profiled kernels "
               f"{rep.profiled_kernel_ms:.2f} ms")
    f = rep.factors
    if rep.tau_rows:
        click.echo(f"τ predicted (decode simulated on teacher-forced lattices; the system's "
                   f"measured τ {rep.tau_measured:.2f})")
        click.echo(f"{'mode':<6} {'budget':>6} {'depth':>5} {'τ':>6} {'steps':>6} "
                   f"{'nodes/step':>10} {'speedup':>8}")
        for r in rep.tau_rows:
            click.echo(f"{r.mode:<6} {r.budget:>6} {r.max_depth:>5} {r.tau:>6.2f} {r.steps:>6} "
                       f"{r.nodes_per_step:>10.1f} {r.speedup:>7.2f}x")
    best = "chain" if rep.tau_method == "exact" and rep.tau_best_budget == 0 else \
        f"tree, budget {rep.tau_best_budget}"
    click.echo(f"τ factor        {f['tau']:.2f}x  ({rep.tau_method}; best: {best}, "
               f"τ {rep.tau_curve[rep.tau_best_budget]:.2f})")
    why = ("the profile ran the static steps eagerly; the timed ones replay CUDA graphs"
           if rep.profile_path == "eager" else
           "tokens verified per step not recorded: the kernels' bounds need them")
    for name in ("kernel", "overhead"):
        click.echo(f"{name + ' factor':<15} " + (
            f"{f[name]:.2f}x" if f[name] is not None else f"n/a ({why})"))
    click.echo(f"largest: {rep.suggested} -> {rep.direction}")


def register(cli: click.Group) -> None:
    cli.add_command(compare_cmd)
    cli.add_command(gate_cmd)
    cli.add_command(analyze_cmd)
