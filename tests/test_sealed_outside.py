"""Issue 21, class 3: sealed material never lands in the repository. A sealed gate run
(real workers, the tiny random model) leaves stock's sealed references beside the secret
seed, in folders only the controller's user can enter, and nothing under the project
(its caches and run records included) holds a sealed prompt's ids or stock's output."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cycle_fixtures import project, shared_cache  # noqa: F401

pytestmark = pytest.mark.slow


def _files(root: Path):
    for folder, _dirs, names in os.walk(root, followlinks=True):   # the cache is a link
        for name in names:
            yield Path(folder) / name


def _assert_nowhere(root: Path, sequences: list[list[int]]) -> None:
    needles = [sep.join(map(str, seq[:8])) for seq in sequences for sep in (",", ", ")]
    for f in _files(root):
        assert not f.name.startswith("sealed-"), f
        data = f.read_bytes().decode("latin-1")
        for needle in needles:
            assert needle not in data, (f, needle)


def test_sealed_references_live_beside_the_seed_and_nowhere_in_the_repository(project):
    from specpilot.config import load_config
    from specpilot.judges.gates import gate_requests, run_gate
    from specpilot.requests.sealed import default_sealed_dir

    model = load_config(project).model.path
    [(rid, _prompt, prompt_ids)] = gate_requests(model, "sealed", 1)
    report = run_gate(project, "sealed", {}, True, False, 1, 12)
    assert report.passed and report.requests == [rid]
    _assert_nowhere(project, [prompt_ids])            # no sealed prompt in the project

    from specpilot.judges.forcing import ReferenceCache

    cache = ReferenceCache.for_check(project, "sealed")
    [path] = [p for p in _files(cache.folder) if p.name.startswith(f"{rid}@")]
    ref = cache.get(model, path.parent.name, rid, 12)
    assert ref.prompt_ids == prompt_ids and len(ref.tokens) == 12
    _assert_nowhere(project, [ref.tokens])            # nor stock's output for it
    assert cache.folder.parent == default_sealed_dir() and project not in cache.folder.parents
    for folder, _dirs, names in os.walk(cache.folder):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
        for name in names:
            assert stat.S_IMODE(os.stat(Path(folder) / name).st_mode) == 0o600, name
