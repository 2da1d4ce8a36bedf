"""Shared fixtures: the embedded model is loaded once per session (fp32, CPU)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch


def _share_cores_between_workers() -> None:
    """Under pytest-xdist (the README's `-n 2`) each worker takes its share of the cores
    for its own torch threads, not every core: two workers of torch's default (all cores
    each) oversubscribe them and wait on each other's OpenMP threads. On this 2-core CPU
    the suite ran in 822 s so (one thread a worker), 871 s with both at every core, 1099 s
    in one process (docs/results.md). OMP_NUM_THREADS or SPECPILOT_THREADS set by the user
    wins."""
    from specpilot import threads

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1 and not (os.environ.get("OMP_NUM_THREADS") or os.environ.get(threads.ENV)):
        torch.set_num_threads(max(1, threads.cpus_here() // workers))


_share_cores_between_workers()


@pytest.fixture(autouse=True)
def _torch_threads_kept():
    """Each test leaves this process's torch threads as it found them: one test that set 2
    and never set them back ran every later test of its xdist worker at 2 threads beside the
    other worker's 1 on the 2 cores (that test took 45 s in the suite, 5 s alone)."""
    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(scope="module", autouse=True)
def child_threads():
    """Processes the tests start (the judges' workers above all) at the torch threads the
    `specpilot` command gives its own (specpilot/threads.py): the cores other tasks do not
    hold now, decided per test module, unless OMP_NUM_THREADS or SPECPILOT_THREADS is set.
    The tests call the judges in-process, past the command's threads.install(), so their
    workers took torch's default, every core: on a 2-core CPU with one core busy elsewhere a
    worker of the tiny target then ran 25x slower (two OpenMP threads stalling on the held
    core), and the cycle tests' timings turned to noise. This process's own torch threads
    are unchanged (it read them when torch was imported above)."""
    from specpilot import threads

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", str(threads.decide().threads))
        yield


@pytest.fixture(scope="session")
def smol():
    """The embedded default as a System (fp32 CPU, 2048-token context)."""
    from stock.system import load_system

    torch.manual_seed(0)
    return load_system("embedded", device="cpu", max_context=2048)


@pytest.fixture(scope="session")
def dev_prompts(smol):
    """Eight dev prompts (code, math, chat, ...) as chat token ids."""
    from specpilot.requests import load_dev, select

    reqs = select(load_dev(), None, 2)[:8]
    return [smol.tokenizer.chat(r.prompt) for r in reqs]


@pytest.fixture(scope="session")
def ar_32():
    """The embedded default's greedy AR output on the eight dev prompts, 32 new tokens each:
    the first 32 of those recorded in tests/data/greedy_64.json (greedy: a prefix), which
    tests/test_greedy_recorded.py checks the engine's AR still gives. Read, not computed:
    each xdist worker that met a test using it computed it once (18-28 s of the CPU)."""
    recorded = json.loads((Path(__file__).parent / "data" / "greedy_64.json").read_text())
    return [t[:32] for t in recorded["tokens"]["ar"]]
