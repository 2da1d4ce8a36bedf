"""The metadata of one memory entry: a versioned pydantic model, serialized as TOML.

The same bytes live in two places: the git note on the entry commit
(`refs/notes/specpilot`) and the portable file `memory/<id>.toml`.
"""

from __future__ import annotations

import os
import re
import tomllib
from datetime import datetime, timezone
from typing import Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from specpilot.errors import SpecPilotError

SCHEMA_VERSION = 1
SLUG = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
HEX40 = r"^[0-9a-f]{40}$"
Scalar = bool | int | float | str


class SchemaError(SpecPilotError):
    """Entry metadata that does not match the schema."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OptionSpec(_Strict):
    """An option the entry registers; its default must reproduce stock bit-exactly."""

    name: str
    type: Literal["bool", "int", "float", "str"]
    default: Scalar
    tuned: Scalar | None = None
    help: str = ""


class Constraint(_Strict):
    """A correctness constraint the entry must keep (e.g. token forcing, identical logits)."""

    kind: Literal["token_forcing", "bit_identical_logits", "custom"]
    detail: str = ""


class Result(_Strict):
    """One measured result, with where and how it was measured."""

    metric: str
    value: float
    ci_low: float | None = None
    ci_high: float | None = None
    confidence: float = 0.95
    hardware: str = ""
    model: str = ""
    request_set: str = ""
    controller_run: str = ""
    verdict: str = ""          # the controller's verdict, for controller results
    date: datetime | None = None
    stale: bool = False


class Provenance(_Strict):
    kind: Literal["discovered", "reused", "hand-written"] = "hand-written"
    reused_from: str | None = None
    detail: str = ""


class Validation(_Strict):
    """Where an entry a cycle recorded stands with that cycle's final validation.

    A cycle records an entry when the controller adopts it (dev gates and controller passed)
    as `provisional`; the cycle's Phase 4 (sealed requests, at least twice the dev length)
    marks the entries its system is made of `validated` or `rejected`. Only a validated
    entry, or one no cycle recorded (no `validation`: hand-written, imported), is reused."""

    status: Literal["provisional", "validated", "rejected"]
    run: str = ""              # the cycle run that last set the status
    detail: str = ""
    date: datetime | None = None


class Rebased(_Strict):
    """One move of the entry onto a new stock."""

    from_base: str = Field(pattern=HEX40)
    to_base: str = Field(pattern=HEX40)
    from_commit: str = Field(pattern=HEX40)
    date: datetime
    resolved_from: str | None = Field(None, pattern=HEX40)   # a conflict resolved by hand


class Amended(_Strict):
    """One replacement of the entry's change (`specpilot memory amend`), and why."""

    from_commit: str = Field(pattern=HEX40)
    reason: str
    date: datetime
    from_deps: list[str] | None = None   # the dependencies before, where the amend changed them


class EntryMeta(_Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    id: str
    title: str
    summary: str = ""
    deps: list[str] = Field(default_factory=list)
    base: str = Field(pattern=HEX40)
    source_tree: str = Field(pattern=HEX40)
    patch_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created: datetime
    provenance: Provenance = Field(default_factory=Provenance)
    options: list[OptionSpec] = Field(default_factory=list)
    constraints: list[Constraint] = Field(default_factory=list)
    results: list[Result] = Field(default_factory=list)
    applicability: list[str] = Field(default_factory=list)
    untested: list[str] = Field(default_factory=list)
    # the serving load it acts on: "batched" entries change only the batched engine
    # (stock/batch.py), so a planner judging single requests does not offer them
    load: Literal["any", "batched"] = "any"
    rebased: list[Rebased] = Field(default_factory=list)
    amended: list[Amended] = Field(default_factory=list)
    validation: Validation | None = None   # None: not recorded by a cycle

    @property
    def reusable(self) -> bool:
        """May a planner reuse it: not awaiting or failed a cycle's final validation."""
        return self.validation is None or self.validation.status == "validated"

    @field_validator("id")
    @classmethod
    def _slug(cls, value: str) -> str:
        check_id(value)
        return value

    @field_validator("deps")
    @classmethod
    def _deps(cls, value: list[str]) -> list[str]:
        for dep in value:
            check_id(dep)
        if len(set(value)) != len(value):
            raise ValueError("deps lists an entry twice")
        return value

    def to_toml(self) -> bytes:
        """The canonical serialization (fields in model order, no nulls; `amended` only once
        there is one, so entries written before the field existed keep their bytes)."""
        data = self.model_dump(mode="python", exclude_none=True)
        if not data.get("amended"):
            data.pop("amended", None)
        return tomli_w.dumps(data).encode()

    @classmethod
    def from_toml(cls, data: bytes, where: str) -> "EntryMeta":
        try:
            raw = tomllib.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise SchemaError(f"{where}: not valid TOML: {exc}") from exc
        return cls.validate_dict(raw, where)

    @classmethod
    def validate_dict(cls, raw: dict, where: str) -> "EntryMeta":
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
                for err in exc.errors())
            raise SchemaError(f"{where}: does not match the entry schema: {problems}") from exc

    def commit_message(self) -> str:
        return f"{self.title}\n\nSpecPilot-Entry: {self.id}\n"

    def git_date(self) -> str:
        """The entry commit's date: its `created` time, so import re-creates the same hash."""
        return f"{int(self.created.timestamp())} +0000"


def check_id(value: str) -> str:
    """An id is a lowercase slug that is also a valid git ref name component (it names
    refs/specpilot/entries/<id>): no '..', and not ending in '.' or '.lock'."""
    if not SLUG.match(value):
        raise ValueError(f"{value!r} is not a valid entry id (lowercase slug: a-z 0-9 . _ -)")
    if ".." in value or value.endswith((".", ".lock")):
        raise ValueError(f"{value!r} is not a valid entry id: it must also be a valid git "
                         f"ref name (no '..', not ending in '.' or '.lock')")
    return value


def now() -> datetime:
    """Current UTC time to the second; SOURCE_DATE_EPOCH pins it (reproducible runs)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        return datetime.fromtimestamp(int(epoch), tz=timezone.utc)
    return datetime.now(timezone.utc).replace(microsecond=0)
