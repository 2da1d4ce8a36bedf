"""False adoption of the controller's rule, by simulation through the real code.

Synthetic worker processes stand in for the real ones (same `run` and `ready`), and the
controller's own round loop (`controller.measure`: labels, rotated interleaving, warm-up,
per-label times) times them; the run's times then go through `stats.judge`, the one
function `controller.compare` calls. Nothing about the layout or the decision is
re-implemented here except the rule before issue 20 (`old_rule`), kept only to show what
the new one stops.

The machine's noise, per timed request (log scale):

    log t = log base[request] + drift(t) + step(t) + offset[process] + e  (- log(1 + gain) for B)

- base: per-request time, 0.2-2 s, new requests every round (requests differ 10×;
  pairing removes them);
- drift: the machine's speed, shared by every process, a slow AR(1) over the sequence of
  calls (interleaving cancels most of it);
- offset: each worker process runs a constant few % faster or slower for its life
  (placement, allocator, clocks): `process_sd`;
- e: per-measurement noise, `round_sd` (normal, or Student-t with `tail_df` scaled to that
  SD), plus slow outliers (`outlier_rate`, up to `outlier_scale` slower).
- step: a load that starts partway through the measured rounds and stays (another job
  starting on the machine), `step` slower in log from a random call on, for every process.

A "stale" model measures σ on a quieter machine (`stale`: its noise when the cached σ was
taken): the old rule takes its σ from a separate A/A run under it; the new rule is given
that σ as a floor (`--sigma`), which can only raise its bar, never lower it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as sps

from specpilot.config import ControllerSection
from specpilot.judges import controller, stats
from specpilot.judges.worker_proc import Reply


@dataclass(frozen=True)
class NoiseModel:
    name: str
    round_sd: float = 0.007        # per-measurement SD of log t (each request, each round)
    process_sd: float = 0.0        # per-process offset SD (log), constant for its life
    drift_sd: float = 0.01         # machine drift (log SD), shared by every process
    drift_rho: float = 0.98        # drift's correlation from one call to the next
    tail_df: float | None = None   # Student-t per-measurement noise with this many df
    outlier_rate: float = 0.0      # chance a measurement is a slow outlier
    outlier_scale: float = 0.5     # an outlier is uniform(0, this) slower, in log
    step: float = 0.0              # a load that starts at a random call of the run (after
                                   # the warm-up) and lasts: every later call this much
                                   # slower, in log
    stale: "NoiseModel | None" = None  # the quieter machine a cached σ was measured on


MODELS = [
    NoiseModel("iid, per-round SD 0.7%", round_sd=0.007),
    NoiseModel("iid, per-round SD 3%", round_sd=0.03),
    NoiseModel("process offset SD 0.5%", round_sd=0.007, process_sd=0.005),
    NoiseModel("process offset SD 1%", round_sd=0.007, process_sd=0.01),
    NoiseModel("process offset SD 2%", round_sd=0.007, process_sd=0.02),
    NoiseModel("process offset SD 3%", round_sd=0.007, process_sd=0.03),
    NoiseModel("stale σ: quiet 0.2%/0 then 3%/1%", round_sd=0.03, process_sd=0.01,
               stale=NoiseModel("quiet", round_sd=0.002, process_sd=0.0, drift_sd=0.002)),
    NoiseModel("heavy tails t(2) 1% + 3% outliers", round_sd=0.01, tail_df=2.0,
               outlier_rate=0.03, outlier_scale=0.7, process_sd=0.005),
    NoiseModel("a load from a random call on: 2x slower", round_sd=0.03, process_sd=0.01,
               step=math.log(2.0)),
]
REALISTIC = NoiseModel("realistic: offset 0.5%, per-round 0.7%", round_sd=0.007,
                       process_sd=0.005)


class Machine:
    """The shared machine: its drift advances one step per timed call; with a `step`
    model, a load starts at call `load_at` (drawn from `calls`, a range of call numbers)."""

    def __init__(self, model: NoiseModel, rng: np.random.Generator,
                 calls: tuple[int, int] = (0, 1)):
        self.model, self.rng, self.drift, self.calls = model, rng, 0.0, 0
        self.load_at = int(rng.integers(*calls)) if model.step else None

    def step(self) -> float:
        m = self.model
        self.drift = m.drift_rho * self.drift + \
            math.sqrt(1 - m.drift_rho ** 2) * m.drift_sd * float(self.rng.normal())
        self.calls += 1
        loaded = self.load_at is not None and self.calls > self.load_at
        return self.drift + (m.step if loaded else 0.0)

    def noise(self) -> float:
        m, rng = self.model, self.rng
        if m.tail_df is not None:   # Student-t scaled to SD round_sd (df > 2) or to scale
            scale = math.sqrt((m.tail_df - 2) / m.tail_df) if m.tail_df > 2 else 1.0
            e = m.round_sd * scale * float(rng.standard_t(m.tail_df))
        else:
            e = m.round_sd * float(rng.normal())
        if m.outlier_rate and rng.random() < m.outlier_rate:
            e += m.outlier_scale * float(rng.random())
        return e


@dataclass
class SyntheticWorker:
    """Stands in for worker_proc.Worker: `run` returns a Reply with a synthetic time."""

    label: str
    machine: Machine
    base: dict           # request id -> seconds
    offset: float        # this process's life-long log offset
    speedup: float       # B's true log gain (0 for A)
    ready: dict = field(default_factory=lambda: {"hardware": "synthetic"})

    def run(self, request_id: str, max_new: int, prompt=None, ids=None) -> Reply:
        log_t = (math.log(self.base[request_id]) + self.machine.step() + self.offset
                 + self.machine.noise() - self.speedup)
        return Reply([1, 2, 3], math.exp(log_t), 0.0, max_new)


def synthetic_run(rng: np.random.Generator, model: NoiseModel, gain: float, processes: int,
                  rounds: int, requests: int, warmup_rounds: int = 1,
                  b_is_a: bool = False) -> controller.Paired:
    """One paired run through the controller's round loop, on synthetic workers: fresh
    requests every round (as `prompts.draw` gives the controller), each its own length."""
    rows = [[(f"r{r}-{i}", None, [1]) for i in range(requests)]
            for r in range(warmup_rounds + rounds)]
    job = controller.Job(rows, 8, "ngram", ["cpu"], rounds, warmup_rounds, "synthetic",
                         processes=processes)
    per_round = requests * 2 * processes   # timed calls a round
    machine = Machine(model, rng, (warmup_rounds * per_round,
                                   (warmup_rounds + rounds) * per_round))
    base = {req[0]: float(rng.uniform(0.2, 2.0)) for row in rows for req in row}
    workers = {}
    for label in controller.labels(processes):
        speedup = 0.0 if (label.startswith("A") or b_is_a) else math.log1p(gain)
        workers[label] = SyntheticWorker(label, machine, base,
                                         float(rng.normal(0, model.process_sd)), speedup)
    return controller.measure(workers, job)[0]


def new_rule(rng, model: NoiseModel, gain: float, cfg: ControllerSection, family: int,
             rounds: int, requests: int) -> bool:
    """The controller's decision on one synthetic run (a stale model's σ as a floor)."""
    paired = synthetic_run(rng, model, gain, cfg.processes, rounds, requests)
    floor = None
    if model.stale is not None:   # the most a stale σ can do: be given as --sigma
        quiet = synthetic_run(rng, model.stale, 0.0, cfg.processes, rounds, requests)
        floor = stats.estimate(quiet.times, cfg, family).sigma
    _, dec = stats.judge(paired.times, paired.diverged, cfg, family, sigma_floor=floor)
    return dec.adopted


def old_rule(rng, model: NoiseModel, gain: float, cfg: ControllerSection, rounds: int,
             requests: int, resamples: int = 999) -> bool:
    """The rule before issue 20, as it was: one process per side, d = log(tA/tB) per pair,
    a t bound below 15 pairs and a BCa bootstrap at or above; σ = sqrt(gain² + se²) of a
    separate one-process-per-side A/A run (under `model.stale` when it has one)."""
    ab = synthetic_run(rng, model, gain, 1, rounds, requests)
    aa = synthetic_run(rng, model.stale or model, 0.0, 1, rounds, requests, b_is_a=True)

    def bound(paired) -> tuple[float, float, float]:
        d = stats.log_ratios(*paired.flat())
        n, mean, sd = len(d), float(d.mean()), float(d.std(ddof=1))
        if sd == 0:
            low = mean
        elif n < 15:
            low = float(sps.ttest_1samp(d, 0.0, alternative="greater")
                        .confidence_interval(cfg.confidence).low)
        else:
            res = sps.bootstrap((d,), np.mean, n_resamples=resamples, vectorized=True,
                                confidence_level=cfg.confidence, alternative="greater",
                                method="BCa", rng=rng)
            low = float(res.confidence_interval.low)
        return math.expm1(mean), math.expm1(low), math.expm1(sd / math.sqrt(n))

    gain_ab, low_ab, _ = bound(ab)
    gain_aa, _, se_aa = bound(aa)
    sigma = math.sqrt(gain_aa ** 2 + se_aa ** 2)
    return low_ab > cfg.min_gain + cfg.sigma_multiple * sigma


@dataclass
class Row:
    model: str
    trials: int
    false_adoption: float        # new rule, true gain 0
    honest_adoption: float       # new rule, true gain `honest_gain`
    old_false_adoption: float | None = None


def rate(rule, trials: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    return sum(bool(rule(rng)) for _ in range(trials)) / trials


def table(models: list[NoiseModel] | None = None, trials: int = 200, family: int = 3,
          processes: int = 2, rounds: int = 4, requests: int = 4, honest_gain: float = 0.10,
          old: bool = True, cfg: ControllerSection | None = None, seed: int = 0) -> list[Row]:
    cfg = (cfg or ControllerSection()).model_copy(update={"processes": processes})
    out = []
    for k, model in enumerate(models or MODELS + [REALISTIC]):
        s = seed + 1000 * k
        false = rate(lambda g: new_rule(g, model, 0.0, cfg, family, rounds, requests),
                     trials, s)
        honest = rate(lambda g: new_rule(g, model, honest_gain, cfg, family, rounds, requests),
                      trials, s + 1)
        old_false = rate(lambda g: old_rule(g, model, 0.0, cfg, rounds, requests),
                         trials, s + 2) if old else None
        out.append(Row(model.name, trials, false, honest, old_false))
    return out


def format_table(rows: list[Row], honest_gain: float, header: str) -> str:
    lines = [header,
             f"{'noise model':<42} {'trials':>6} {'false adoption':>15} "
             f"{f'+{honest_gain:.0%} adopted':>14} {'old rule false':>15}"]
    for r in rows:
        old = "-" if r.old_false_adoption is None else f"{r.old_false_adoption:.1%}"
        lines.append(f"{r.model:<42} {r.trials:>6} {r.false_adoption:>15.1%} "
                     f"{r.honest_adoption:>14.1%} {old:>15}")
    return "\n".join(lines)
