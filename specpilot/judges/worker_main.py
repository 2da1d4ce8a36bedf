"""The controller's worker: serves one system from one clean checkout, in its own process.

Run by the controller as `python -P -B -s worker_main.py RESULT_FD` with
PYTHONPATH=<checkout>, so `import stock` is that checkout's code and nothing else. Standard
library and torch only: it must not import specpilot (the checkout has none).

Channel: requests arrive as JSON lines on stdin; replies go to the private pipe RESULT_FD,
never to stdout (which, with stderr, goes to a log), so nothing the candidate prints can
forge or corrupt a reply. The controller times each request itself around the pipe.

First message: setup {checkout, system_paths, model, options, device, max_context,
drafter}. The worker hashes the checkout's system paths as git would (before importing any
of it), loads the system, and replies `ready` with the options in effect, the tree hash and
where `stock` was imported from; the controller checks all three against what it asked.
Then: {"cmd": "run", "id", "prompt" | "ids", "max_new"} -> {"event": "done", tokens, ...};
"force" {ids, forced, chunk, digests} and "reference" {ids, length, draft_len, chunk} serve
the correctness gates; "tokenize" {prompt}; {"cmd": "quit"} or end of input ends it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import time
from pathlib import Path


def _blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _tree(rows: list[tuple[str, str, str]]) -> str:
    """rows of (mode, name, sha) -> git tree hash (git's order: trees sort as 'name/')."""
    keyed = sorted(((n + "/" if m == "40000" else n).encode(), m, n, s) for m, n, s in rows)
    body = b"".join(m.encode() + b" " + n.encode() + b"\0" + bytes.fromhex(s)
                    for _k, m, n, s in keyed)
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def _entry(path: Path) -> tuple[str, str] | None:
    """(mode, sha) of a file, link or folder as git stores it; None for an empty folder."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        return "120000", _blob(os.readlink(path).encode())
    if stat.S_ISDIR(st.st_mode):
        rows = []
        for child in sorted(path.iterdir()):
            found = _entry(child)
            if found:
                rows.append((found[0], child.name, found[1]))
        return ("40000", _tree(rows)) if rows else None
    mode = "100755" if st.st_mode & stat.S_IXUSR else "100644"
    return mode, _blob(path.read_bytes())


def tree_hash(root: Path, paths: list[str]) -> str:
    """The git tree hash of `paths` under `root` (matches GitStore.system_tree)."""
    nested: dict = {}
    for p in paths:
        p = p.strip("/")
        found = _entry(root / p) if (root / p).exists() or (root / p).is_symlink() else None
        if found is None:
            continue
        node = nested
        *dirs, leaf = p.split("/")
        for part in dirs:
            node = node.setdefault(part, {})
        node[leaf] = found

    def build(node: dict) -> str:
        return _tree([("40000", n, build(v)) if isinstance(v, dict) else (v[0], n, v[1])
                      for n, v in node.items()])
    return build(nested)


def _place(device: str):
    """'cpu:N' stands in for device N: one thread pinned to core N (mod the cores)."""
    import torch

    if device.startswith("cpu:"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(device[4:]) % len(cores)]})
        torch.set_num_threads(1)
        return "cpu"
    return device


def compute_dtype(device: str):
    """Stock's compute dtype: bf16 on CUDA, fp32 elsewhere (as stock.system.load_system)."""
    import torch

    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def _hardware(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


class Server:
    def __init__(self, setup: dict):
        checkout = Path(setup["checkout"]).resolve()
        self.tree = tree_hash(checkout, setup["system_paths"])  # before importing any of it
        device = _place(setup["device"])
        import stock
        import stock.system  # noqa: F401 - registers every option the system defines (drafters')
        import torch
        from stock.options import Options

        where = Path(stock.__file__).resolve()
        if checkout not in where.parents:
            raise RuntimeError(f"stock imported from {where}, not from the checkout {checkout}")
        self.stock_file = str(where)
        torch.manual_seed(0)
        options = Options(setup.get("options") or {})
        model = setup["model"]
        if model.startswith("random:"):
            from stock.config import PRESETS
            from stock.engine import Engine
            from stock.model import Transformer
            from stock.system import make_drafter

            net = Transformer.random(PRESETS[model[7:]], torch.device(device),
                                     compute_dtype(device))
            self.engine = Engine(net, options, setup.get("max_context") or 1024, set())
            self.tokenizer = None
            self.drafter = make_drafter(setup.get("drafter"), self.engine)
        else:
            from stock.system import load_system

            system = load_system(model, options, device, setup.get("max_context"))
            self.engine, self.tokenizer = system.engine, system.tokenizer
            self.drafter = system.drafter(setup.get("drafter"))
        self.hardware = _hardware(device)

    def ready(self) -> dict:
        import torch

        return {"event": "ready", "options": self.engine.options.as_dict(),
                "non_default": self.engine.options.non_default(), "tree": self.tree,
                "stock_file": self.stock_file, "hardware": self.hardware,
                "torch": torch.__version__, "pid": os.getpid(),
                "dtype": str(self.engine.model.dtype).removeprefix("torch."),
                "drafter": type(self.drafter).__name__ if self.drafter is not None else None}

    def force(self, msg: dict) -> dict:
        fr = self.engine.force(list(msg["ids"]), list(msg["forced"]), chunk=msg.get("chunk"),
                               digests=bool(msg.get("digests")))
        return {"event": "done", "id": msg.get("id"), "argmax": fr.argmax, "margin": fr.margin,
                "digests": fr.digests}

    def reference(self, msg: dict) -> dict:
        """Greedy output by lossless ngram speculation, then this engine's forced pass."""
        from stock.engine import Engine
        from stock.options import Options
        from stock.system import make_drafter

        eng = Engine(self.engine.model, Options({"draft_len": int(msg["draft_len"])}),
                     self.engine.max_context, self.engine.stop_ids)
        eng.cache = self.engine.cache
        gen = eng.generate(list(msg["ids"]), int(msg["length"]), make_drafter("ngram", eng))
        fr = self.engine.force(list(msg["ids"]), gen.tokens, chunk=msg.get("chunk"), digests=True)
        return {"event": "done", "id": msg.get("id"), "tokens": gen.tokens,
                "stop_reason": gen.stop_reason, "argmax": fr.argmax, "margin": fr.margin,
                "digests": fr.digests}

    def tokenize(self, msg: dict) -> dict:
        return {"event": "done", "id": msg.get("id"), "ids": self.tokenizer.chat(msg["prompt"])}

    def run(self, msg: dict) -> dict:
        if "ids" in msg:
            ids = list(msg["ids"])
        elif self.tokenizer is not None:
            ids = self.tokenizer.chat(msg["prompt"])
        else:
            raise RuntimeError("this model has no tokenizer: send token ids")
        res = self.engine.generate(ids, int(msg["max_new"]), self.drafter)
        return {"event": "done", "id": msg.get("id"), "tokens": res.tokens,
                "steps": res.steps, "prefill_s": res.prefill_s, "decode_s": res.decode_s}


def main(argv: list[str]) -> int:
    out = os.fdopen(int(argv[1]), "w", buffering=1)

    def reply(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    server = None
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        try:
            if server is None:
                server = Server(msg)
                reply(server.ready())
            elif msg.get("cmd") == "quit":
                break
            elif msg.get("cmd") in ("run", "force", "reference", "tokenize"):
                t0 = time.perf_counter()
                result = getattr(server, msg["cmd"])(msg)
                result["worker_s"] = time.perf_counter() - t0
                reply(result)
            else:
                raise RuntimeError(f"unknown message {msg!r}")
        except Exception as exc:  # reported over the channel, then the worker ends
            reply({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
