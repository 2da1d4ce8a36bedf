"""The dependency DAG of memory entries: validation, topological order, ancestry."""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from specpilot.errors import SpecPilotError


class CycleError(SpecPilotError):
    """Entries whose dependencies loop back on themselves."""


class MissingDependencyError(SpecPilotError):
    """An entry names a dependency that is not in memory."""


class DuplicateIdError(SpecPilotError):
    """Two entries with one id."""


def check_unique(ids: Sequence[str], where: str = "memory") -> None:
    seen: set[str] = set()
    for entry_id in ids:
        if entry_id in seen:
            raise DuplicateIdError(f"duplicate entry id {entry_id!r} in {where}")
        seen.add(entry_id)


def topo_order(deps: Mapping[str, Sequence[str]]) -> list[str]:
    """All ids, dependencies first; ties broken by id so the order is stable.

    Raises MissingDependencyError or CycleError naming the entries involved.
    """
    for entry_id in sorted(deps):
        for dep in deps[entry_id]:
            if dep not in deps:
                raise MissingDependencyError(
                    f"entry {entry_id!r} depends on {dep!r}, which is not in memory")
    indegree = {entry_id: len(set(d)) for entry_id, d in deps.items()}
    children: dict[str, list[str]] = {entry_id: [] for entry_id in deps}
    for entry_id, ds in deps.items():
        for dep in set(ds):
            children[dep].append(entry_id)
    ready = [entry_id for entry_id, n in indegree.items() if n == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        entry_id = heapq.heappop(ready)
        order.append(entry_id)
        for child in children[entry_id]:
            indegree[child] -= 1
            if indegree[child] == 0:
                heapq.heappush(ready, child)
    if len(order) != len(deps):
        cycle = find_cycle({k: v for k, v in deps.items() if k not in set(order)})
        raise CycleError(f"dependency cycle (x -> y: x depends on y): {' -> '.join(cycle)}")
    return order


def find_cycle(deps: Mapping[str, Sequence[str]]) -> list[str]:
    """One cycle among `deps` (every id here lies on or leads to a cycle)."""
    start = min(deps)
    path, seen = [start], {start: 0}
    while True:
        nxt = min(d for d in deps[path[-1]] if d in deps)
        if nxt in seen:
            return path[seen[nxt]:] + [nxt]
        seen[nxt] = len(path)
        path.append(nxt)


def ancestors(deps: Mapping[str, Sequence[str]], entry_id: str) -> set[str]:
    found: set[str] = set()
    stack = list(deps[entry_id])
    while stack:
        dep = stack.pop()
        if dep not in found:
            found.add(dep)
            stack.extend(deps[dep])
    return found


def replay_sequence(deps: Mapping[str, Sequence[str]], order: Sequence[str],
                    entry_id: str) -> list[str]:
    """The entries to apply, in order, to rebuild `entry_id`: its ancestors, then itself."""
    wanted = ancestors(deps, entry_id)
    return [e for e in order if e in wanted] + [entry_id]


def layers(deps: Mapping[str, Sequence[str]], order: Sequence[str]) -> dict[str, int]:
    """Depth of each entry: 0 for entries on the base, else 1 + deepest dependency."""
    depth: dict[str, int] = {}
    for entry_id in order:
        depth[entry_id] = 1 + max((depth[d] for d in deps[entry_id]), default=-1)
    return depth
