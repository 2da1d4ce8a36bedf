"""The `[explore]` section of `.specpilot/config.toml`: how much evidence a cycle buys.

Defaults keep one full cycle on a 2-core CPU (embedded SmolLM2-135M) well under 20 minutes:
few dev requests, short generations, few controller rounds. On a GPU, raise them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from specpilot.config import Config, ControllerSection, GatesSection


class ExploreSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    planner: str = "auto"              # auto | offline | anthropic
    backend: str = "auto"              # sub-agents: auto | offline | anthropic | command
    model: str = "claude-sonnet-4-5"   # Anthropic model name
    command: str = ""                  # external agent command template (task on stdin)
    max_directions: int = Field(3, ge=1)
    analyze_requests: int = Field(1, ge=1)   # Phase 0 profile
    analyze_max_new: int = Field(16, ge=1)
    parallel_cpu: int = Field(1, ge=1)  # sub-agents at once without CUDA
    devices: list[str] = Field(default_factory=list)  # empty: all CUDA devices, else CPU
    # pre-screen: cheapest evidence, one short paired round
    prescreen_requests: int = Field(1, ge=1)
    prescreen_max_new: int = Field(16, ge=1)
    prescreen_min_gain: float = 0.03
    tune_values: int = Field(2, ge=1)  # candidate values per option the tuner tries
    # Phase 3 kernel tuning: the worst categories (measured over byte/FLOP bound) first
    kernel_categories: int = Field(2, ge=0)   # categories tuned per cycle
    kernel_configs: int = Field(4, ge=1)      # option configurations tried per category
    # options that act on a category, beyond those whose name/help names it
    kernel_options: dict[str, list[str]] = Field(default_factory=dict)
    # gates (dev token forcing) and controller, scaled down for the CPU
    gate_requests: int = Field(2, ge=1)
    gate_length: int = Field(32, ge=1)
    controller_rounds: int = Field(2, ge=2)
    controller_requests: int = Field(2, ge=1)
    controller_max_new: int = Field(16, ge=1)
    # final validation on sealed requests
    validate_requests: int = Field(2, ge=1)
    validate_length: int = Field(0, ge=0)   # 0: [gates] sealed_length on CUDA, 64 on CPU
    # agent limits
    agent_steps: int = Field(40, ge=1)
    agent_tokens: int = Field(400_000, ge=1000)
    agent_cost_usd: float = Field(5.0, ge=0)
    cycle_cost_usd: float = Field(20.0, ge=0)
    command_timeout_s: float = Field(300.0, gt=0)
    agent_timeout_s: float = Field(1800.0, gt=0)


def explore_settings(cfg: Config) -> ExploreSection:
    return ExploreSection.model_validate((cfg.model_extra or {}).get("explore", {}))


def gates_for_cycle(cfg: Config, ex: ExploreSection) -> GatesSection:
    return cfg.gates.model_copy(update={"dev_length": ex.gate_length,
                                        "dev_requests": ex.gate_requests})


def controller_for_cycle(cfg: Config, ex: ExploreSection) -> ControllerSection:
    # Warm-up rounds stay [controller] warmup_rounds: controller.compare reads them itself.
    return cfg.controller.model_copy(update={"rounds": ex.controller_rounds,
                                             "requests": ex.controller_requests,
                                             "max_new": ex.controller_max_new})


def validate_length(cfg: Config, ex: ExploreSection) -> int:
    """Sealed forcing length: as configured, else the full length on CUDA and 64 on CPU."""
    if ex.validate_length:
        return ex.validate_length
    import torch

    return cfg.gates.sealed_length if torch.cuda.is_available() else 64
