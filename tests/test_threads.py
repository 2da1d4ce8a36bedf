"""Issue 30, item 1: torch's threads sized to the cores free, and a word when timings are
suspect (specpilot/threads.py). The decisions are pure functions of what /proc says; the
last test runs the real command and reads the thread count its torch used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specpilot import threads

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("cpus, others, want", [
    (2, 0, 2), (2, 1, 1), (2, 2, 1), (2, 7, 1), (16, 3, 13), (16, 0.4, 16), (1, 0, 1)])
def test_threads_are_the_cores_not_held_by_others(cpus, others, want):
    assert threads.free_threads(cpus, others) == want


def test_contention_is_a_held_core_or_a_load_above_the_cores():
    assert not threads.contended(2, 0, 1.9)
    assert threads.contended(2, 1, 0.0)
    assert threads.contended(2, 0, 2.5)


def test_spread_is_slowest_over_fastest():
    assert threads.spread([1.0, 1.0, 1.0]) == 1.0
    assert threads.spread([2.0, 1.0, 3.0]) == 3.0
    assert threads.spread([1.0]) == 1.0


def test_a_bar_out_of_reach_is_said_and_a_normal_one_is_not():
    assert threads.noise_warning(0.005, 0.02) is None
    assert threads.noise_warning(None, None) is None
    said = threads.noise_warning(0.368, 0.746)
    assert said.startswith("warning: ") and "36.8%" in said and "74.6%" in said


def _decide(monkeypatch, environ, runnable, cpus=2, cpu_count=2):
    monkeypatch.setattr(threads, "_runnable", lambda: runnable)
    monkeypatch.setattr(threads, "cpus_here", lambda: cpus)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: cpu_count)
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    return threads.decide(environ)


def test_decide_reads_the_runnable_count_less_ourselves(monkeypatch):
    d = _decide(monkeypatch, {}, (3, 2.4))   # us + two others running
    assert (d.threads, d.others, d.source, d.busy) == (1, 2, "free cores", True)
    d = _decide(monkeypatch, {}, (1, 0.1))   # us alone
    assert (d.threads, d.busy) == (2, False)


def test_the_users_count_wins_and_a_hosts_load_is_not_read(monkeypatch):
    assert _decide(monkeypatch, {"SPECPILOT_THREADS": "3"}, (9, 9.0)).threads == 3
    assert _decide(monkeypatch, {"OMP_NUM_THREADS": "1"}, (1, 0.0)).source == "user"
    d = _decide(monkeypatch, {}, (40, 30.0), cpus=2, cpu_count=64)   # a pinned container
    assert (d.threads, d.source, d.busy) == (2, "all cores", False)


def test_install_exports_the_count_and_the_busy_note_names_it(monkeypatch):
    env: dict = {}
    monkeypatch.setattr(threads, "_decided", None)
    monkeypatch.setattr(threads, "decide", lambda e: threads.Decision(1, 2, 1.0, 2.5,
                                                                      "free cores"))
    threads.install(env)
    assert env["OMP_NUM_THREADS"] == "1"
    note = threads.busy_note()
    assert note.startswith("warning: 1 other runnable task(s) on 2 core(s)") and "1 thread" in note


def test_the_command_runs_torch_at_the_threads_it_decided(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(PYTHONPATH=str(REPO), SPECPILOT_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "specpilot", "run", "hi", "--ar", "--max-new",
                          "2", "--json", "--device", "cpu"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["threads"] == 1
