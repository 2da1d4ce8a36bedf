"""The `[explore]` section of `.specpilot/config.toml`: how much evidence a cycle buys.

Defaults keep one full cycle on a 2-core CPU (embedded SmolLM2-135M) well under 20 minutes:
few dev requests, short generations, few controller rounds. On a GPU, raise them. Part of
`specpilot.config.Config`, so it is checked (unknown keys, types, ranges) whenever the file
is loaded; specpilot/cycle/settings.py derives the cycle's settings from it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

BACKENDS = ("auto", "offline", "anthropic", "command")


class ExploreSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    planner: str = "auto"              # auto | offline | anthropic
    # who writes code changes: auto (Claude with a key, else nobody), offline (nobody: reuse
    # and tuning only), anthropic (Claude), command (agent_command, your own coding agent)
    backend: Literal["auto", "offline", "anthropic", "command"] = "auto"
    model: str = "claude-sonnet-4-5"   # Anthropic model name
    # the command backend's argv, run in the direction's worktree with the task on stdin;
    # {option}, {title} and {direction} in any argument are filled in
    agent_command: list[str] = Field(default_factory=list)
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
    gate_length: int = Field(0, ge=0)  # 0: [gates] dev_length on CUDA, CPU_GATE_LENGTH on CPU
    controller_rounds: int = Field(2, ge=2)
    controller_requests: int = Field(2, ge=1)
    controller_max_new: int = Field(16, ge=1)
    # the serving load the cycle judges: 0, request by request; C > 0, batched: the
    # pre-screen, every controller verdict (explore, integration, kernel tuning, validation)
    # in the controller's throughput mode at concurrency C (2C requests a round, at least
    # [controller] min_pairs rounds: one pair a round and process), and the planner offers
    # the entries for the batched engine (load = "batched"). The tuner's own search still
    # times single requests; its pick is pre-screened and judged batched.
    batch: int = Field(0, ge=0, le=1024)
    # final validation on sealed requests
    validate_requests: int = Field(2, ge=1)
    # 0: [gates] sealed_length on CUDA, 2 x the dev length on CPU; never below 2 x the dev
    # length, so the sealed check reaches a fault the dev check cannot see
    validate_length: int = Field(0, ge=0)
    # a controller gain above the cost model's ceiling (the product of Phase 0's factors)
    # times this margin is a measurement fault, not an optimization (below 1: stricter than
    # the cost model itself)
    plausible_margin: float = Field(1.5, gt=0)
    # agent limits
    agent_steps: int = Field(40, ge=1)
    agent_tokens: int = Field(400_000, ge=1000)
    agent_cost_usd: float = Field(5.0, ge=0)
    cycle_cost_usd: float = Field(20.0, ge=0)
    command_timeout_s: float = Field(300.0, gt=0)
    agent_timeout_s: float = Field(1800.0, gt=0)
    # agent commands under bubblewrap (agents/sandbox.py); without a working bwrap the
    # anthropic and command backends refuse to start. false: the explicit opt-out, agent
    # commands then run with your rights
    agent_sandbox: bool = True

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data):
        if isinstance(data, dict) and "command" in data:
            raise ValueError("command is now agent_command, a list: "
                             "agent_command = [\"my-agent\", \"--task-on-stdin\"]")
        return data

    @model_validator(mode="after")
    def _command_needs_a_command(self) -> "ExploreSection":
        if self.backend == "command" and not self.agent_command:
            raise ValueError("backend = \"command\" needs agent_command = [argv of your "
                             "coding agent]")
        return self
