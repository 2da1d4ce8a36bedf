"""What a cycle derives from `.specpilot/config.toml`: its `[explore]` section (defined in
specpilot/explore_config.py) and the gate, controller and validation settings scaled by it.
"""

from __future__ import annotations

from specpilot.config import Config, ControllerSection, GatesSection
from specpilot.cycle.devices import cuda_available
from specpilot.errors import SpecPilotError
from specpilot.explore_config import BACKENDS, ExploreSection  # noqa: F401 (re-exported)

CPU_GATE_LENGTH = 32   # the dev forcing length on a CPU: small, so a cycle stays short


def explore_settings(cfg: Config) -> ExploreSection:
    """The [explore] section (validated with the rest of the file by load_config)."""
    return cfg.explore


_cuda = cuda_available   # a module attribute (tests replace it)


def dev_length(cfg: Config, ex: ExploreSection) -> int:
    """Dev forcing length: as configured, else [gates] dev_length on CUDA and
    CPU_GATE_LENGTH on a CPU (a small dev length, not a short sealed check, keeps a CPU
    cycle short)."""
    if ex.gate_length:
        return ex.gate_length
    return cfg.gates.dev_length if _cuda() else CPU_GATE_LENGTH


def gates_for_cycle(cfg: Config, ex: ExploreSection) -> GatesSection:
    return cfg.gates.model_copy(update={"dev_length": dev_length(cfg, ex),
                                        "dev_requests": ex.gate_requests})


def controller_for_cycle(cfg: Config, ex: ExploreSection) -> ControllerSection:
    # Warm-up rounds stay [controller] warmup_rounds: controller.compare reads them itself.
    return cfg.controller.model_copy(update={"rounds": ex.controller_rounds,
                                             "requests": ex.controller_requests,
                                             "max_new": ex.controller_max_new})


def validate_length(cfg: Config, ex: ExploreSection) -> int:
    """Sealed forcing length: at least twice the dev length on every device (the paper: dev
    up to 2048, sealed up to 4096), so a fault after the dev length is caught. As
    configured (an error below 2 x dev), else [gates] sealed_length on CUDA and 2 x dev on a
    CPU, never below 2 x dev."""
    dev = dev_length(cfg, ex)
    if ex.validate_length:
        if ex.validate_length < 2 * dev:
            raise SpecPilotError(f"[explore] validate_length {ex.validate_length} is below "
                                 f"2 x the dev forcing length {dev}: the sealed check must "
                                 f"reach past what the dev check saw", code=2)
        return ex.validate_length
    return max(cfg.gates.sealed_length if _cuda() else 0, 2 * dev)
