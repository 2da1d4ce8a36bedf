"""`.specpilot/config.toml`: the committed deployment configuration."""

from __future__ import annotations

import difflib
import re
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specpilot.errors import SpecPilotError
from specpilot.explore_config import ExploreSection

CONFIG_RELPATH = Path(".specpilot") / "config.toml"


class ModelSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = "embedded"


class RequestsSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dev: str = "builtin:dev"
    sealed: str = ""


class ControllerSection(BaseModel):
    """Thresholds and design of the paired benchmark (see specpilot/judges/stats.py)."""
    model_config = ConfigDict(extra="forbid")
    min_gain: float = Field(0.01, ge=0)            # adopt only if lower bound > this + k·σ
    sigma_multiple: float = Field(2.0, ge=0)       # k
    divergent_min_gain: float = Field(0.03, ge=0)  # the bar when outputs diverge from best
    confidence: float = Field(0.95, gt=0.5, lt=1)  # one-sided level, before the family split
    # Worker processes per side, all timed in every round (A0 B0 A1 B1, rotated): the
    # spread of same-side processes is the run's own σ and the bound's error term, with
    # 2·processes - 2 degrees of freedom. 2..8 (even with two devices); each one is a
    # resident copy of the model (2 per side: 4 workers on one device, 2 on each of two).
    processes: int = Field(2, ge=2, le=8)
    # No decision below this many (round, request) pairs per process (rounds × requests);
    # 2..10000. The bound stays valid with fewer (its error term is the process spread),
    # but a process mean over a handful of requests is moved by one slow request and an
    # honest gain is then missed (bench/judges_false_adoption.py --rounds 2 --requests 1).
    min_pairs: int = Field(8, ge=2, le=10000)
    # Pairs of workers (A_i, B_i) alive at once; 0: all P. 1 runs the pairs one session
    # after another on the same rounds, for a target of which only two copies fit in one
    # device (a 27B-class model on one H200); sessions' drift counts in the same-side spread.
    resident: int = Field(0, ge=0, le=8)
    # Processes that compute stock's reference outputs before any candidate starts, the
    # measured requests shared among them (each a resident copy of the model, loaded one
    # after another), and, in throughput mode, the stock workers that the timed outputs are
    # forced through after the rounds (the outputs dealt among them): 2 for a small target
    # on one GPU (256 references in 2 m 37 s in two on the H100, 2026-12-06); 1 for a
    # target of which only one more copy fits.
    reference_processes: int = Field(1, ge=1, le=8)
    # Start the candidates' workers once the prompts are tokenized and let them prepare
    # (capture their graphs, compile) while stock's reference is computed, instead of
    # after it: both are untimed, and on a small target they were a verdict's two largest
    # phases (2 m 18 s and 2 m 45 s of 7 m 54 s on the H100, 2026-12-06). Every worker of
    # the run is then resident at once (stock's reference workers beside the candidates'),
    # so only for a target of which that many copies fit; with `resident` pairs run in
    # several sessions it does nothing.
    prepare_beside_reference: bool = False
    rounds: int = Field(4, ge=2)                   # measured rounds (A B B A ...)
    warmup_rounds: int = Field(1, ge=0)            # run first, never counted
    requests: int = Field(4, ge=1)                 # dev requests per round
    max_new: int = Field(32, ge=1)                 # new tokens per request
    # The drafter both sides serve: "auto" (the block drafter where its weights were trained
    # for the target, as the shipped ones for the embedded default; else n-gram), ngram,
    # draft, block, or "ar" for autoregressive.
    drafter: str = "auto"
    # Timed outputs may leave stock's only at the reference's near-ties (gates.
    # near_tie_epsilon), at most this many per reference token (at least one); each
    # continuation past one is timed too (specpilot/judges/outputs.py).
    near_tie_rate: float = Field(0.01, ge=0, le=1)


class GatesSection(BaseModel):
    """Correctness gates (see specpilot/judges/forcing.py)."""
    model_config = ConfigDict(extra="forbid")
    near_tie_epsilon: float = Field(0.05, ge=0)    # reference margin counted as a near-tie
    near_tie_rate: float = Field(0.002, ge=0, le=1)  # tolerated near-tie mismatches per token
    dev_length: int = Field(2048, ge=1)            # forced new tokens, development check
    sealed_length: int = Field(4096, ge=1)         # forced new tokens, sealed final check
    dev_requests: int = Field(8, ge=1)            # dev requests a check forces
    sealed_requests: int = Field(8, ge=1)
    chunk: int = Field(9, ge=1)                   # tokens per forced step (stock: draft_len + 1)
    default_tokens: int = Field(64, ge=1)         # generated tokens the option-default gate compares
    reference_draft_len: int = Field(16, ge=1)    # lossless ngram drafting speeds references up
    # bf16/fp16 stock: near_tie_epsilon and the rates widen to this many times stock's own
    # measured noise (judges/outputs.py, `tolerance`); 0 keeps them as configured
    noise_factor: float = Field(2.0, ge=0)


class JudgesSection(BaseModel):
    """How the judges run candidate code (see specpilot/judges/confine.py)."""
    model_config = ConfigDict(extra="forbid")
    confine: bool = True   # every worker under bubblewrap; false: candidates get your rights


class Config(BaseModel):
    """The whole file: every section, and the file itself, forbids unknown keys."""
    model_config = ConfigDict(extra="forbid")
    schema_version: int = 1
    system_paths: list[str] = Field(default_factory=lambda: ["stock", "kernels"])
    model: ModelSection = Field(default_factory=ModelSection)
    requests: RequestsSection = Field(default_factory=RequestsSection)
    controller: ControllerSection = Field(default_factory=ControllerSection)
    gates: GatesSection = Field(default_factory=GatesSection)
    judges: JudgesSection = Field(default_factory=JudgesSection)
    explore: ExploreSection = Field(default_factory=ExploreSection)


SECTIONS: dict[str, type[BaseModel]] = {
    name: f.annotation for name, f in Config.model_fields.items()
    if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)}


def find_root(start: Path | None = None) -> Path | None:
    """The nearest folder at or above `start` holding `.specpilot/config.toml`."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / CONFIG_RELPATH).is_file():
            return folder
    return None


def require_root() -> Path:
    """The project root found from the cwd, or a usage error that says to run init."""
    root = find_root()
    if root is None:
        raise SpecPilotError("not in a SpecPilot project (no .specpilot/config.toml); "
                             "run `specpilot init`", code=2)
    return root


def load_config(root: Path | None = None) -> Config:
    """The config of the project at `root` (or found from the cwd); defaults if none.
    Anything wrong in the file is one SpecPilotError (code 2) naming the file and the
    section and key: unreadable, not UTF-8, not TOML, an unknown section or key, a value of
    the wrong type or out of its range."""
    root = root or find_root()
    if root is None:
        return Config()
    path = root / CONFIG_RELPATH
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise SpecPilotError(f"cannot read {CONFIG_RELPATH}: {exc.strerror or exc}",
                             code=2) from None
    except UnicodeDecodeError as exc:
        raise SpecPilotError(f"not UTF-8 text: byte {exc.object[exc.start]:#04x} at offset "
                             f"{exc.start} ({CONFIG_RELPATH})", code=2) from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecPilotError(f"not valid TOML: {exc} ({CONFIG_RELPATH})", code=2) from None
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise SpecPilotError(f"{describe(exc)} ({CONFIG_RELPATH})", code=2) from None


def describe(exc: ValidationError) -> str:
    """A pydantic error of the file on one line: `[section] key: what is wrong (got …)`."""
    errors = exc.errors()
    err = errors[0]
    loc = [str(p) for p in err["loc"]]
    section = loc[0] if loc and loc[0] in SECTIONS else None
    keys = loc[1:] if section else loc
    where = (f"[{section}] " if section else "") + ".".join(keys)
    kind, value = err["type"], err.get("input")
    if kind == "extra_forbidden":
        text = f"{where}: unknown key" if section else f"{where}: unknown section or key"
        known = _known(section)
        close = difflib.get_close_matches(keys[-1], known, 3) if keys else []
        text += f"; did you mean {' or '.join(close)}?" if close else \
            f"; known: {', '.join(known)}"
    elif kind == "literal_error":
        choices = ", ".join(re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected"))))
        text = f"{where} {value!r} is not one of {choices}"
    else:
        msg = err["msg"].removeprefix("Value error, ")
        shown = "" if kind == "value_error" or isinstance(value, dict) else f" (got {value!r})"
        if keys:
            text = f"{where}: {msg}{shown}"
        elif kind == "value_error":   # the section's own check
            text = f"[{section}] {msg}"
        else:                         # the section itself is not a table
            text = f"{section}: {msg}{shown}"
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more)"
    return text


def _known(section: str | None) -> list[str]:
    return list((SECTIONS[section] if section else Config).model_fields)
