"""Model configuration: one dataclass for Llama-family and Qwen3 dense models."""

from __future__ import annotations

import json
import numbers
from dataclasses import asdict, dataclass, field
from pathlib import Path

ARCHS = ("llama", "qwen3")
POSITIVE_INTS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim", "max_position")
HF_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads")
HF_INTS = HF_REQUIRED + ("num_key_value_heads", "head_dim", "max_position_embeddings")


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _hf_float(value):
    """rope_theta as a float; anything else is left for __post_init__ to name."""
    return float(value) if _is_number(value) else value


@dataclass
class ModelConfig:
    arch: str = "llama"
    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    rope_theta: float = 100000.0
    rms_norm_eps: float = 1e-5
    max_position: int = 8192
    tie_embeddings: bool = True
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before RoPE
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self):
        """Every field checked, each error naming it (ValueError)."""
        if self.arch not in ARCHS:
            raise ValueError(f"unsupported architecture {self.arch!r}; supported: {', '.join(ARCHS)}")
        for name in POSITIVE_INTS:
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if not _is_number(value) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        ids = ([] if self.bos_token_id is None else [self.bos_token_id]) + list(self.eos_token_ids)
        if not all(_is_int(i) and i >= 0 for i in ids):
            raise ValueError(f"token ids must be non-negative integers: bos_token_id "
                             f"{self.bos_token_id!r}, eos_token_ids {self.eos_token_ids!r}")

    @classmethod
    def from_hf(cls, hf: dict) -> "ModelConfig":
        """From a Hugging Face `config.json` dictionary (LlamaForCausalLM, Qwen3ForCausalLM).
        A missing or mistyped field is a ValueError that names it as config.json does."""
        if not isinstance(hf, dict):
            raise ValueError(f"expected a JSON object, got {type(hf).__name__}")
        model_type = hf.get("model_type", "llama")
        arch = {"llama": "llama", "qwen3": "qwen3"}.get(model_type)
        if arch is None:
            raise ValueError(f"unsupported model_type {model_type!r}; supported: llama, qwen3")
        for key in HF_REQUIRED:
            if key not in hf:
                raise ValueError(f"missing {key}")
        for key in HF_INTS:
            if key in hf and hf[key] is not None and (not _is_int(hf[key]) or hf[key] <= 0):
                raise ValueError(f"{key} must be a positive integer, got {hf[key]!r}")
        heads = hf["num_attention_heads"]
        eos = hf.get("eos_token_id")
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        return cls(
            arch=arch,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads", heads),
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rope_theta=_hf_float(hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            max_position=hf.get("max_position_embeddings", 4096),
            tie_embeddings=hf.get("tie_word_embeddings", False),
            qk_norm=arch == "qwen3",
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    def to_hf(self) -> dict:
        """A Hugging Face `config.json` dictionary that `transformers` loads."""
        hf = {
            "model_type": self.arch,
            "architectures": ["LlamaForCausalLM" if self.arch == "llama" else "Qwen3ForCausalLM"],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position,
            "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": "float32",
        }
        if self.bos_token_id is not None:
            hf["bos_token_id"] = self.bos_token_id
        if self.eos_token_ids:
            hf["eos_token_id"] = self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else self.eos_token_ids
        return hf

    def save(self, folder: Path) -> None:
        (folder / "specpilot_model.json").write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, folder: Path) -> "ModelConfig":
        return cls(**json.loads((folder / "specpilot_model.json").read_text()))


# Named presets, for tests and benchmarks with random weights.
PRESETS: dict[str, ModelConfig] = {
    "smollm2-135m": ModelConfig(),
    "tiny-qwen3": ModelConfig(
        arch="qwen3", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-6,
        max_position=1024, tie_embeddings=False, qk_norm=True,
    ),
    # 27B-class dense target (about 64 GB in bf16), for GPU benchmarks with random weights.
    "dense-27b": ModelConfig(
        arch="qwen3", vocab_size=151936, hidden_size=5120, intermediate_size=25600, num_layers=64,
        num_heads=64, num_kv_heads=8, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
        max_position=32768, tie_embeddings=False, qk_norm=True,
    ),
}
