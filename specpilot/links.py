"""Symbolic links in a system tree: which ones lead out of it.

A link in the system paths must lead to a path inside the system paths, as resolved in the
tree itself (following the tree's other links, the way the file system will once it is
checked out). An absolute target, a target that climbs above the tree's root, a loop, or a
target outside the system paths is refused: a clean checkout holds the system paths alone,
so such a link would reach files nobody hashed (or files outside the checkout altogether),
and making a checkout read-only must never reach through one.

Pure: works on `{path: target}` from `GitStore.links`, no git and no file system.
"""

from __future__ import annotations

from specpilot.errors import SpecPilotError

MAX_HOPS = 40  # as the kernel's limit on links followed in one lookup


class UnsafeLinkError(SpecPilotError):
    """A symbolic link that leads out of the tree or the system paths."""


def resolve(path: str, links: dict[str, str]) -> str | None:
    """Where `path` leads inside the tree, following `links`; None if it leaves the tree
    (an absolute target, `..` above the root) or loops."""
    parts: list[str] = []
    todo = [p for p in path.split("/")]
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
            continue
        parts.append(part)
        target = links.get("/".join(parts))
        if target is None:
            continue
        hops += 1
        if hops > MAX_HOPS or target.startswith("/"):
            return None
        parts.pop()
        todo = target.split("/") + todo
    return "/".join(parts)


def inside(path: str, roots: list[str]) -> bool:
    return any(path == r.strip("/") or path.startswith(r.strip("/") + "/") for r in roots)


def leaving(links: dict[str, str], system_paths: list[str]) -> list[tuple[str, str]]:
    """(link, target) for every link that does not lead inside the system paths."""
    bad = []
    for path, target in sorted(links.items()):
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        where = resolve(f"{parent}/{target}" if parent else target, links) \
            if not target.startswith("/") else None
        if where is None or not inside(where, system_paths):
            bad.append((path, target))
    return bad


def check(links: dict[str, str], system_paths: list[str], what: str) -> None:
    """Raise UnsafeLinkError naming the first link of `what` that leads out."""
    bad = leaving(links, system_paths)
    if bad:
        path, target = bad[0]
        raise UnsafeLinkError(
            f"{what}: symbolic link {path!r} -> {target!r} leads outside the system paths "
            f"({', '.join(system_paths)}); links must stay inside them")
