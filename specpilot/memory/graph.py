"""Drawing the DAG as text: one line per entry, indented by depth, with its dependencies."""

from __future__ import annotations

from specpilot.memory.dag import layers, topo_order
from specpilot.memory.store import Entry


def graph_json(entries: dict[str, Entry]) -> dict:
    order = topo_order({eid: e.meta.deps for eid, e in entries.items()})
    return {
        "bases": sorted({e.meta.base for e in entries.values()}),
        "nodes": [{"id": eid, "title": entries[eid].meta.title, "base": entries[eid].meta.base,
                   "commit": entries[eid].commit} for eid in order],
        "edges": [{"from": dep, "to": eid} for eid in order for dep in entries[eid].meta.deps],
    }


def draw(entries: dict[str, Entry]) -> str:
    """
    base 1a2b3c4d5e6f
    ├─ a          Fuse QKV
    │  ├─ b       ← a
    ...
    Entries with several dependencies are drawn under their deepest one and list all.
    """
    if not entries:
        return "(no memory entries)"
    deps = {eid: e.meta.deps for eid, e in entries.items()}
    order = topo_order(deps)
    depth = layers(deps, order)
    children: dict[str | None, list[str]] = {}
    for eid in order:
        parent = max(deps[eid], key=lambda d: (depth[d], d)) if deps[eid] else None
        children.setdefault(parent, []).append(eid)
    width = max(3 * depth[eid] + 3 + len(eid) for eid in order)
    lines: list[str] = []

    def walk(node: str, prefix: str, last: bool) -> None:
        meta = entries[node].meta
        head = f"{prefix}{'└─ ' if last else '├─ '}{node}"
        more = f"  ← {', '.join(meta.deps)}" if len(meta.deps) > 1 else ""
        lines.append(f"{head:<{width}} {meta.title}{more}")
        kids = children.get(node, [])
        for i, kid in enumerate(kids):
            walk(kid, prefix + ("   " if last else "│  "), i == len(kids) - 1)

    roots = children.get(None, [])
    for base in sorted({entries[r].meta.base for r in roots}):
        lines.append(f"base {base[:12]}")
        mine = [r for r in roots if entries[r].meta.base == base]
        for i, root in enumerate(mine):
            walk(root, "", i == len(mine) - 1)
    return "\n".join(lines)
