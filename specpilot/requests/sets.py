"""Request sets for the stock engine.

A *request* is one prompt with a category and a generation budget. The development set
(``specpilot/requests/data/dev.jsonl``) is written for this project and is visible to agents;
the sealed set (see :mod:`specpilot.requests.sealed`) is generated per machine and never committed.

File format: JSON Lines, one object per line::

    {"id": "code-001", "category": "code", "prompt": "...", "max_new_tokens": 384}

Blank lines are ignored. Every other line must be a JSON object with exactly these four
fields; ids must be unique within a file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "CATEGORIES",
    "DEV_RESOURCE",
    "Request",
    "dump_jsonl",
    "load_dev",
    "load_jsonl",
    "parse_jsonl",
    "select",
    "spread",
]

# The categories of the dev set and of the sealed generator; a user's own request file may
# use any category name (a slug).
CATEGORIES: tuple[str, ...] = ("code", "chat", "math", "summarisation", "long-form")

DEV_PACKAGE = "specpilot.requests.data"
DEV_RESOURCE = "dev.jsonl"


class Request(BaseModel):
    """One generation request."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=False)

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    category: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    prompt: str = Field(min_length=1)
    max_new_tokens: int = Field(ge=1, le=65536)

    def to_json(self) -> str:
        """One JSONL line (without the newline), keys in the canonical order."""
        return json.dumps(self.model_dump(), ensure_ascii=False)


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<object>"
        if e["type"] == "missing":
            parts.append(f"missing field {loc!r}")
        elif e["type"] == "extra_forbidden":
            parts.append(f"unknown field {loc!r}")
        else:
            parts.append(f"field {loc!r}: {e['msg']}")
    return "; ".join(parts)


def parse_jsonl(lines: Iterable[str], source: str) -> list[Request]:
    """Parse JSONL text into requests. ``source`` names the file in error messages.

    Raises ValueError of the form ``"<source>:<line>: <problem>"`` for a line that is not
    JSON, not an object, misses or adds a field, has a bad value, or repeats an id.
    """
    out: list[Request] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: malformed JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        try:
            req = Request.model_validate(obj)
        except ValidationError as exc:
            raise ValueError(f"{where}: invalid request: {_describe(exc)}") from None
        if req.id in seen:
            raise ValueError(
                f"{where}: duplicate id {req.id!r} (first seen on line {seen[req.id]})"
            )
        seen[req.id] = lineno
        out.append(req)
    return out


def load_jsonl(path: str | Path) -> list[Request]:
    """Load requests from a JSONL file; see :func:`parse_jsonl` for the errors raised."""
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not UTF-8 text (byte offset {exc.start})") from None
    return parse_jsonl(text.split("\n"), str(p))


def dump_jsonl(requests: Iterable[Request], path: str | Path) -> None:
    """Write requests as JSONL (UTF-8, one object per line)."""
    with Path(path).open("w", encoding="utf-8") as fh:
        for r in requests:
            fh.write(r.to_json() + "\n")


def load_dev() -> list[Request]:
    """The committed development request set, read from the ``stock.data`` package."""
    res = resources.files(DEV_PACKAGE).joinpath(DEV_RESOURCE)
    text = res.read_text(encoding="utf-8")
    return parse_jsonl(text.splitlines(), f"{DEV_PACKAGE}/{DEV_RESOURCE}")


def select(
    requests: Sequence[Request],
    categories: Iterable[str] | None = None,
    limit_per_category: int | None = None,
) -> list[Request]:
    """Filter requests by category and cap how many are kept per category.

    Order is preserved (the first ``limit_per_category`` of each category are kept).
    Unknown category names raise ValueError, so a typo cannot silently select nothing.
    """
    wanted: set[str] | None = None
    if categories is not None:
        if isinstance(categories, str):
            categories = [categories]
        wanted = set(categories)
        present = {r.category for r in requests}
        unknown = sorted(wanted - present)
        if unknown:
            raise ValueError(f"unknown categories {unknown}; this set has {sorted(present)}")
    if limit_per_category is not None and limit_per_category < 0:
        raise ValueError(f"limit_per_category must be >= 0, got {limit_per_category}")
    counts: dict[str, int] = {}
    out: list[Request] = []
    for r in requests:
        if wanted is not None and r.category not in wanted:
            continue
        n = counts.get(r.category, 0)
        if limit_per_category is not None and n >= limit_per_category:
            continue
        counts[r.category] = n + 1
        out.append(r)
    return out


def spread(requests: Sequence[Request], count: int) -> list[Request]:
    """`count` requests spread over the categories present: the first ceil(count / number
    of categories) of each, in file order, cut to `count`, whatever the categories' names."""
    cats = {r.category for r in requests}
    if not cats or count <= 0:
        return []
    return select(requests, None, -(-count // len(cats)))[:count]


def interleaved(requests: Sequence[Request]) -> list[Request]:
    """Every request, the categories taken in turn (the first of each in order of first
    appearance, then the second of each, ...), each category's own order kept: every
    prefix is as even a mix as the set allows. The dev set is stored a category at a time,
    so its first 32 requests are all code."""
    by_cat: dict[str, list[Request]] = {}
    for r in requests:
        by_cat.setdefault(r.category, []).append(r)
    out: list[Request] = []
    for i in range(max((len(v) for v in by_cat.values()), default=0)):
        out += [v[i] for v in by_cat.values() if i < len(v)]
    return out

