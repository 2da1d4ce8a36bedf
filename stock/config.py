"""Model configuration: one dataclass for Llama-family and Qwen3 dense models and for hybrid
Gated-DeltaNet targets (Qwen3.5's text model, Qwen3-Next with dense MLPs): most layers GDN
linear attention with a recurrent state, every few a gated full-attention layer."""

from __future__ import annotations

import json
import numbers
from dataclasses import asdict, dataclass, field
from pathlib import Path

ARCHS = ("llama", "qwen3", "qwen3_5", "qwen3_next")
HYBRID_ARCHS = ("qwen3_5", "qwen3_next")
LAYER_TYPES = ("full_attention", "linear_attention")
LINEAR_INTS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
               "linear_value_head_dim", "linear_conv_kernel")
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
    # hybrid targets (HYBRID_ARCHS): per-layer types, GDN shapes, partial RoPE, the
    # attention's output gate, and RMSNorm weights stored as offsets from 1 (zero-centred)
    layer_types: list[str] = field(default_factory=list)  # empty: every layer full attention
    linear_num_key_heads: int = 1
    linear_num_value_heads: int = 1
    linear_key_head_dim: int = 1
    linear_value_head_dim: int = 1
    linear_conv_kernel: int = 4
    partial_rotary_factor: float = 1.0
    attn_output_gate: bool = False
    norm_offset: bool = False

    @property
    def hybrid(self) -> bool:
        return self.arch in HYBRID_ARCHS

    def layer_type(self, i: int) -> str:
        return self.layer_types[i] if self.layer_types else "full_attention"

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

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
        if self.layer_types:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(f"layer_types lists {len(self.layer_types)} layers; the model "
                                 f"has {self.num_layers}")
            for i, kind in enumerate(self.layer_types):
                if kind not in LAYER_TYPES:
                    raise ValueError(f"unsupported layer type {kind!r} at layer {i}; "
                                     f"supported: {', '.join(LAYER_TYPES)}")
            if "linear_attention" in self.layer_types and not self.hybrid:
                raise ValueError(f"linear_attention layers need a hybrid architecture "
                                 f"({', '.join(HYBRID_ARCHS)}), not {self.arch!r}")
        for name in LINEAR_INTS:
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        rd = self.head_dim * self.partial_rotary_factor if _is_number(
            self.partial_rotary_factor) else None
        if rd is None or not 0 < self.partial_rotary_factor <= 1 or rd != int(rd) or int(rd) % 2:
            raise ValueError(f"partial_rotary_factor {self.partial_rotary_factor!r} must give an "
                             f"even rotary dimension in (0, head_dim {self.head_dim}]")
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
        if model_type == "qwen3_5" and isinstance(hf.get("text_config"), dict):
            hf = {**hf["text_config"], "model_type": "qwen3_5_text"}   # the VL wrapper's LM
            model_type = "qwen3_5_text"
        arch = {"llama": "llama", "qwen3": "qwen3", "qwen3_5_text": "qwen3_5",
                "qwen3_next": "qwen3_next"}.get(model_type)
        if arch is None:
            raise ValueError(f"unsupported model_type {model_type!r}; supported: llama, qwen3, "
                             f"qwen3_5_text, qwen3_5, qwen3_next")
        for key in HF_REQUIRED:
            if key not in hf:
                raise ValueError(f"missing {key}")
        for key in HF_INTS:
            if key in hf and hf[key] is not None and (not _is_int(hf[key]) or hf[key] <= 0):
                raise ValueError(f"{key} must be a positive integer, got {hf[key]!r}")
        heads = hf["num_attention_heads"]
        hybrid = _hybrid_fields(hf, arch) if arch in HYBRID_ARCHS else {}
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
            qk_norm=arch != "llama",
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            **hybrid,
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
        if self.hybrid:
            hf.update(_hybrid_hf(self))
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


def _hybrid_fields(hf: dict, arch: str) -> dict:
    """ModelConfig fields of a hybrid config.json (Qwen3.5 text, Qwen3-Next); MoE is refused."""
    n = hf["num_hidden_layers"]
    if arch == "qwen3_next":
        sparse = [i for i in range(n) if i not in (hf.get("mlp_only_layers") or [])
                  and (hf.get("num_experts", 512) or 0) > 0
                  and (i + 1) % (hf.get("decoder_sparse_step", 1) or 1) == 0]
        if sparse:
            raise ValueError(f"sparse-MoE MLPs are not supported (layers {sparse[:4]}"
                             f"{'...' if len(sparse) > 4 else ''} of {n}); only dense MLPs are")
    types = hf.get("layer_types")
    if types is None:
        every = hf.get("full_attention_interval", 4)
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    if not isinstance(types, list):
        raise ValueError(f"layer_types must be a list, got {types!r}")
    rope = hf.get("rope_parameters") or {}
    out = dict(layer_types=list(types), norm_offset=True,
               attn_output_gate=hf.get("attn_output_gate", True),
               partial_rotary_factor=_hf_float(rope.get("partial_rotary_factor",
                                                        hf.get("partial_rotary_factor", 0.25))),
               linear_conv_kernel=hf.get("linear_conv_kernel_dim", 4))
    for key in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim"):
        out[key] = hf.get(key, {"linear_num_key_heads": 16, "linear_num_value_heads": 32}.get(key, 128))
    return out


def _hybrid_hf(cfg: "ModelConfig") -> dict:
    """The hybrid part of `to_hf`: what Qwen3_5ForCausalLM / Qwen3NextForCausalLM read."""
    hf = {
        "model_type": "qwen3_5_text" if cfg.arch == "qwen3_5" else "qwen3_next",
        "architectures": ["Qwen3_5ForCausalLM" if cfg.arch == "qwen3_5"
                          else "Qwen3NextForCausalLM"],
        "layer_types": list(cfg.layer_types) or ["full_attention"] * cfg.num_layers,
        "linear_num_key_heads": cfg.linear_num_key_heads,
        "linear_num_value_heads": cfg.linear_num_value_heads,
        "linear_key_head_dim": cfg.linear_key_head_dim,
        "linear_value_head_dim": cfg.linear_value_head_dim,
        "linear_conv_kernel_dim": cfg.linear_conv_kernel,
        "attn_output_gate": cfg.attn_output_gate,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                            "partial_rotary_factor": cfg.partial_rotary_factor},
    }
    if cfg.arch == "qwen3_next":
        hf.update(num_experts=0, mlp_only_layers=list(range(cfg.num_layers)))
    return hf


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
    # hybrid GDN targets: three GDN layers to one gated full-attention layer
    "tiny-hybrid": ModelConfig(
        arch="qwen3_5", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=4,
        num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-6,
        max_position=1024, tie_embeddings=False, qk_norm=True,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel=4, partial_rotary_factor=0.5,
        attn_output_gate=True, norm_offset=True,
    ),
    # Qwen3.5-27B-class shapes (its public config.json's text model): 64 layers, 48 GDN
    "hybrid-27b": ModelConfig(
        arch="qwen3_5", vocab_size=248320, hidden_size=5120, intermediate_size=17408,
        num_layers=64, num_heads=24, num_kv_heads=4, head_dim=256, rope_theta=1e7,
        rms_norm_eps=1e-6, max_position=32768, tie_embeddings=False, qk_norm=True,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 16,
        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel=4, partial_rotary_factor=0.25,
        attn_output_gate=True, norm_offset=True,
    ),
}
