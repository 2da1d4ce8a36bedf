"""Issue 30, item 2: `specpilot explore` off a terminal (a pipe, a file, CI).

The real command, stdout and stderr into one pipe (as `specpilot explore 2>&1 | cat`), on
the tiny random model, stopped before Phase 1 (analyze and plan: seconds): a progress line
per step arrives while it runs, the first names the run's cycle.log, the final table is
printed once and whole (no column cut to 80), and no line shows a raw dict.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from cycle_fixtures import project, shared_cache  # noqa: F401

from specpilot.cycle.types import options_text

REPO = Path(__file__).resolve().parents[1]
STAMP = re.compile(r"^\d\d:\d\d:\d\d \[[a-z0-9._-]+\] ")


def test_explore_through_a_pipe_shows_progress_and_one_whole_table(project):  # noqa: F811
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80"}
    env.pop("ANTHROPIC_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "specpilot", "explore", "--until",
                             "explore"], cwd=project, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines, live_at_analyze = [], None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if "[cycle] phase analyze" in line:   # flushed as it happens, not at the end
            live_at_analyze = proc.poll() is None
    assert proc.wait(timeout=60) == 0, "\n".join(lines)
    text = "\n".join(lines)
    assert live_at_analyze, f"the progress line came only at the end:\n{text}"

    progress = [ln for ln in lines if STAMP.match(ln)]
    first = lines.index(progress[0])   # only a warning of a busy machine comes before it
    assert all(ln.startswith("warning: ") for ln in lines[:first]), text
    log = re.search(r"its log: (\S+cycle\.log)", progress[0])
    assert log and (project / log.group(1)).is_file(), progress[0]
    for step in ("[cycle] phase analyze", "[analyze] factors", "[cycle] phase plan",
                 "[plan] 2 directions", "[cycle] finished phase explore"):
        assert sum(step in ln for ln in progress) == 1, f"{step!r}:\n{text}"

    run_id = log.group(1).split("/")[-2]
    assert sum(ln.strip() == f"{run_id}: phase explore" for ln in lines) == 1, text
    header = next(ln for ln in lines if "direction" in ln and "reason" in ln)
    assert "lower bound" in header and "σ" in header and len(header) > 80
    assert "…" not in text, "a column was cut"
    assert any(ln.startswith("sandbox: ") and ln.rstrip().endswith("no network)")
               for ln in lines), "the footer was wrapped"
    assert "load: single requests" in lines, text   # [explore] batch 0: what was judged
    assert not re.search(r"\{'|\[\{", text), "a raw dict or list was printed"
    assert lines[-1].startswith(f"run record: .specpilot/runs/{run_id}/")


def test_options_read_as_name_value_pairs():
    assert options_text({"draft_len": 3, "compile": False}) == "draft_len=3, compile=False"
    assert options_text({}) == "defaults" and options_text(None) == "defaults"
