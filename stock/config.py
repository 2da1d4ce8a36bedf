"""Model configuration: one dataclass for Llama-family and Qwen3 dense models."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

ARCHS = ("llama", "qwen3")


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
        if self.arch not in ARCHS:
            raise ValueError(f"unsupported architecture {self.arch!r}; supported: {', '.join(ARCHS)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    @classmethod
    def from_hf(cls, hf: dict) -> "ModelConfig":
        """From a Hugging Face `config.json` dictionary (LlamaForCausalLM, Qwen3ForCausalLM)."""
        model_type = hf.get("model_type", "llama")
        arch = {"llama": "llama", "qwen3": "qwen3"}.get(model_type)
        if arch is None:
            raise ValueError(f"unsupported model_type {model_type!r}; supported: llama, qwen3")
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
            rope_theta=float(hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
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
