"""`.specpilot/config.toml`: the committed deployment configuration."""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from specpilot.errors import SpecPilotError

CONFIG_RELPATH = Path(".specpilot") / "config.toml"


class ModelSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = "embedded"


class RequestsSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dev: str = "builtin:dev"
    sealed: str = ""


class Config(BaseModel):
    model_config = ConfigDict(extra="allow")
    schema_version: int = 1
    system_paths: list[str] = Field(default_factory=lambda: ["stock", "kernels"])
    model: ModelSection = Field(default_factory=ModelSection)
    requests: RequestsSection = Field(default_factory=RequestsSection)


def find_root(start: Path | None = None) -> Path | None:
    """The nearest folder at or above `start` holding `.specpilot/config.toml`."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / CONFIG_RELPATH).is_file():
            return folder
    return None


def load_config(root: Path | None = None) -> Config:
    """The config of the project at `root` (or found from the cwd); defaults if none."""
    root = root or find_root()
    if root is None:
        return Config()
    path = root / CONFIG_RELPATH
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SpecPilotError(f"{path}: not valid TOML: {exc}") from exc
    try:
        return Config.model_validate(data)
    except Exception as exc:  # pydantic.ValidationError, flattened to one line
        raise SpecPilotError(f"{path}: {str(exc).splitlines()[0]}") from exc
