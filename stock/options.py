"""Options (variant registration): named, typed behaviour switches whose defaults are stock.

Every behaviour change is an option. Values come, lowest precedence first, from the
registered defaults, a TOML file, the environment (`SPECPILOT_OPTS="a=1,b=x"`) and the
command line (`--opt a=1`). Unknown names and bad values are errors that say what is known.
Every result records the resolved options (`Options.as_dict()`).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stock.errors import StockError

ENV_VAR = "SPECPILOT_OPTS"

# Inclusive ranges of the int options registered at the end of this file (register() takes
# `min=`/`max=` too; options registered elsewhere declare theirs there). Kept in this table
# rather than on the register() lines, which memory entries' patches use as context.
RANGES: dict[str, tuple[int | float | None, int | float | None]] = {
    "graph_prefill_max": (0, 1 << 20), "draft_len": (1, 256), "lattice_topk": (1, 64),
    "ngram_max": (1, 64), "ngram_min": (1, 64), "draft_layers": (1, 1024),
    "repeat_work": (0, 1000), "fault_logit_bias_after": (-1, 1 << 20),
}
# (a, b): a must not exceed b.
ORDERED: tuple[tuple[str, str], ...] = (("ngram_min", "ngram_max"),)


class OptionError(StockError):
    pass


@dataclass(frozen=True)
class Option:
    name: str
    type: type
    default: Any
    help: str
    choices: tuple | None = None
    devices: tuple[str, ...] | None = None  # device types where it has an effect; None: all
    min: int | float | None = None  # inclusive range of an int or float option; None: open
    max: int | float | None = None

    def parse(self, raw: Any) -> Any:
        if isinstance(raw, str):
            value = self._from_text(raw.strip())
        elif self.type is float and isinstance(raw, int) and not isinstance(raw, bool):
            value = float(raw)
        elif isinstance(raw, self.type) and not (self.type is int and isinstance(raw, bool)):
            value = raw
        else:
            raise OptionError(f"option {self.name}: expected {self.type.__name__}, got {raw!r}")
        if self.choices is not None and value not in self.choices:
            raise OptionError(f"option {self.name}: {value!r} is not one of "
                              f"{', '.join(map(str, self.choices))}")
        if self.type is float and value != value:
            raise OptionError(f"option {self.name}: nan is not a number")
        if (self.min is not None and value < self.min) or \
                (self.max is not None and value > self.max):
            raise OptionError(f"option {self.name}: {value!r} is out of its range "
                              f"{self.range_text()}")
        return value

    def range_text(self) -> str:
        """'1..256', '0..' (no upper bound), 'cpu, cuda' (choices) or '' (any)."""
        if self.choices is not None:
            return ", ".join(map(str, self.choices))
        if self.type is bool:
            return "true, false"
        if self.min is None and self.max is None:
            return ""
        return f"{'' if self.min is None else self.min}..{'' if self.max is None else self.max}"

    def _from_text(self, text: str) -> Any:
        try:
            if self.type is bool:
                low = text.lower()
                if low in ("1", "true", "yes", "on"):
                    return True
                if low in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            return self.type(text)
        except ValueError:
            raise OptionError(
                f"option {self.name}: {text!r} is not a valid {self.type.__name__}") from None


REGISTRY: dict[str, Option] = {}


def register(name: str, type: type, default: Any, help: str, choices: tuple | None = None,
             devices: tuple[str, ...] | None = None, *, min: int | float | None = None,
             max: int | float | None = None) -> Option:
    """`devices`: the device types (torch.device(...).type) on which the option changes
    anything, for tools that should not try it elsewhere (the cycle's kernel tuning).
    `min`, `max`: the inclusive range of an int or float option, which must declare at
    least `min` (here, or for this file's own options in RANGES); a value outside it is an
    error when Options are built."""
    if min is None and max is None:
        min, max = RANGES.get(name, (None, None))
    if type in (int, float) and min is None and choices is None:
        raise OptionError(f"option {name}: an {type.__name__} option declares its range "
                          f"(register(..., min=..., max=...))")
    opt = Option(name, type, default, help, choices, devices, min, max)
    if name in REGISTRY and REGISTRY[name] != opt:
        raise OptionError(f"option {name} registered twice with different definitions")
    opt.parse(default)
    REGISTRY[name] = opt
    return opt


class Options:
    """Resolved option values; read-only. Every value is checked against its option's type
    and range, and the pairs in ORDERED against each other, when Options are built."""

    def __init__(self, values: dict[str, Any] | None = None):
        self._values = {n: o.default for n, o in REGISTRY.items()}
        for name, raw in (values or {}).items():
            self._values[name] = _lookup(name).parse(raw)
        for low, high in ORDERED:
            if low in self._values and high in self._values and \
                    self._values[low] > self._values[high]:
                raise OptionError(f"option {low} ({self._values[low]}) must not exceed "
                                  f"{high} ({self._values[high]})")

    def __getitem__(self, name: str) -> Any:
        if name not in self._values:
            _lookup(name)
            self._values[name] = REGISTRY[name].default  # registered after construction
        return self._values[name]

    def as_dict(self) -> dict[str, Any]:
        return dict(sorted(self._values.items()))

    def non_default(self) -> dict[str, Any]:
        return {n: v for n, v in self.as_dict().items() if v != REGISTRY[n].default}

    def with_values(self, **values) -> "Options":
        return Options({**self.non_default(), **values})


def _lookup(name: str) -> Option:
    if name not in REGISTRY:
        raise OptionError(f"unknown option {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def parse_pairs(pairs: list[str] | tuple[str, ...], source: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        if not pair.strip():
            continue
        if "=" not in pair:
            raise OptionError(f"{source}: expected name=value, got {pair!r}")
        name, value = pair.split("=", 1)
        _lookup(name.strip())
        out[name.strip()] = value
    return out


def _read_file(path: Path) -> dict[str, Any]:
    """The options of a TOML file (top level, or its [options] table), each checked."""
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise OptionError(f"options file not found: {path}") from None
    except IsADirectoryError:
        raise OptionError(f"options file {path}: is a directory") from None
    except OSError as exc:
        raise OptionError(f"options file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise OptionError(f"options file {path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} "
                          f"at offset {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise OptionError(f"options file {path}: {exc}") from None
    data = data.get("options", data)
    if not isinstance(data, dict):
        raise OptionError(f"options file {path}: [options] must be a table")
    try:
        for name, raw in data.items():
            _lookup(name).parse(raw)
    except OptionError as exc:
        raise OptionError(f"options file {path}: {exc}") from None
    return data


def resolve(cli: list[str] | tuple[str, ...] = (), toml_path: str | Path | None = None,
            env: dict[str, str] | None = None) -> Options:
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    if toml_path:
        values.update(_read_file(Path(toml_path)))
    values.update(parse_pairs(env.get(ENV_VAR, "").split(","), ENV_VAR))
    values.update(parse_pairs(cli, "--opt"))
    return Options(values)


# The stock system's own options. Patches register theirs in the modules they add.
CUDA = ("cuda",)
register("cuda_graphs", bool, True, "verification steps replayed from CUDA graphs (fixed "
         "shapes, drafts padded to a bucket); used on CUDA only, ignored on CPU", devices=CUDA)
register("compile", bool, True, "static steps (and the block drafter's step) compiled with "
         "torch.compile (inductor) so elementwise work fuses; used on CUDA only, ignored on "
         "CPU", devices=CUDA)
register("fuse_projections", bool, True, "q/k/v and gate/up weights stored as one matrix "
         "each (stock/fused.py) so compiled static steps run one GEMM per group; used with "
         "compile on CUDA only", devices=CUDA)
register("attention_kernel", str, "triton", "attention of compiled static steps: the "
         "split-KV Triton kernel (kernels/attention) or SDPA with the step's mask; used with "
         "compile on CUDA only", choices=("triton", "sdpa"), devices=CUDA)
register("graph_prefill", bool, True, "a prompt of at most graph_prefill_max tokens is "
         "prefilled by static steps (CUDA graphs) of the largest step bucket (64 tokens) "
         "each, instead of by the dynamic forward; used with cuda_graphs on CUDA only",
         devices=CUDA)
register("graph_prefill_max", int, 256, "graph_prefill: the longest prompt prefilled in "
         "static steps (each step reads the weights once, so on a large target a long "
         "prompt is cheaper in one dynamic forward); 0: none", devices=CUDA)
register("draft_len", int, 8, "draft tokens proposed per verification step")
register("lattice_topk", int, 4, "tokens kept per draft position in the lattice")
register("ngram_max", int, 4, "longest n-gram the prompt-lookup drafter matches")
register("ngram_min", int, 1, "shortest n-gram the prompt-lookup drafter matches")
register("draft_layers", int, 4, "layers of the target reused by the truncated draft model")

# Test-only options: they exist to prove the judges work. Defaults are stock exactly.
register("repeat_work", int, 0, "test only: repeat each verification forward this many extra "
         "times (a genuinely slower candidate for the controller's tests)")
register("fault_logit_bias_after", int, -1, "test only: after this many new tokens, add a large "
         "logit bias to one token (the fault the sealed forcing check must catch); -1 = off")
