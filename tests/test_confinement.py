"""Candidate code runs confined: attacks by real candidate commits, served by real workers.

Each attack is a commit whose `stock/__init__.py` does something harmful when imported, in
a temporary project (tests/judge_fixtures.py). Every attack runs twice:
confined (the default), where it must fail, and with the opt-out SPECPILOT_UNCONFINED=1
(the old behaviour: the candidate has the user's rights), where it must succeed; the second
run shows the attack is real and documents what opting out costs. The candidate writes what
it found as one `ATTACK {json}` line to its stdout (the worker's log).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import textwrap
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

import specpilot.judges.stats
from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitStore
from specpilot.config import load_config
from specpilot.judges import confine
from specpilot.judges.controller import compare
from specpilot.judges.worker_main import tree_hash
from specpilot.judges.worker_proc import Worker, clean_checkout
from judge_fixtures import cheat, descendants, git, judge_project

# CI installs bubblewrap (README's test command); elsewhere only the attacks are skipped.
needs_bwrap = pytest.mark.skipif(confine.usable_bwrap() is None, reason="needs bubblewrap")

HERE = Path(__file__).resolve().parents[1]   # this repository
SYS = ["stock", "kernels"]   # the system paths a worker runs
MODEL = "random:tiny-qwen3"
PRELUDE = """

def _attack(P):
    import json, os

    found = {}

    def attempt(name, fn):
        try:
            found[name] = ["ok", fn()]
        except Exception as exc:
            found[name] = ["refused", type(exc).__name__]
"""


@pytest.fixture
def project(tmp_path):
    """tests/judge_fixtures.py's project, with a file of the project's own to attack."""
    root = judge_project(tmp_path / "proj")
    (root / "NOTES.md").write_text("the project's own notes\n")
    git(root, "add", "NOTES.md")
    git(root, "commit", "-qm", "notes")
    return root


@pytest.fixture(params=["confined", "unconfined"])
def mode(request, monkeypatch):
    if request.param == "unconfined":
        monkeypatch.setenv(confine.OPT_OUT, "1")
    else:
        monkeypatch.delenv(confine.OPT_OUT, raising=False)
    return request.param


def candidate(project: Path, name: str, body: str, /, **params) -> str:
    """Commit a candidate whose stock/__init__.py runs `body` (with `P` = params and
    `attempt(name, fn)` to record an outcome) when imported; the worktree stays stock."""
    code = (PRELUDE + textwrap.indent(textwrap.dedent(body), "    ")
            + "\n    print('ATTACK ' + json.dumps(found), flush=True)\n\n\n"
            + f"_attack(__import__('json').loads({json.dumps(params)!r}))\ndel _attack\n")
    return cheat(project, name, code, path="stock/__init__.py")


@contextmanager
def serving(project: Path, rev: str, log: Path, label: str = "B"):
    co = clean_checkout(GitStore(project), rev, SYS, project)
    w = Worker(label, co, SYS, MODEL, {}, "cpu", log)
    try:
        w.start()
        yield w
    finally:
        w.stop()


def found(log: Path) -> dict:
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("ATTACK ")]
    assert len(lines) == 1, log.read_text()
    return json.loads(lines[0][len("ATTACK "):])


def test_a_negative_nan_or_infinite_sigma_floor_is_refused(project):
    """σ is the run's own; a given floor that is negative, NaN or infinite is a usage
    error, before anything runs."""
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(SpecPilotError, match="σ must be finite") as exc:
            compare(project, "stock", "stock", model=MODEL, sigma=bad)
        assert exc.value.code == 2
    assert not (project / ".specpilot" / "runs").exists()


# the compilers' cache of the worker's tree: what it holds, and a file planted there
COMPILE_PROBES = """
    from pathlib import Path
    cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    attempt("where", lambda: str(cache))
    attempt("kernels", lambda: os.environ["KERNELS_CACHE_DIR"])
    attempt("seen", lambda: sorted(p.name for p in cache.glob("*")))
    attempt("plant", lambda: (cache.mkdir(parents=True, exist_ok=True),
                              (cache / P["name"]).write_text("x"))[1])
    """

# (a), (b), (c), (e), (f) and, confined, what the worker sees and the compilers' cache of its
# tree (COMPILE_PROBES; opted out, that cache is the user's own): one candidate makes these
# attacks, each through its own probes and each asserted by its own test below. Their
# outcomes do not depend on one another (each `attempt` records its own result and catches
# its own failure), so one worker per mode serves them all (a worker per test cost ~5 s
# each of the 2-core CPU; one per mode ~5 s in all). The attacks run when the
# candidate's stock is imported, as the worker starts: the worker is what a controller's B
# process runs first (a whole `compare` would add processes and timed rounds that no test
# here asserts anything about).

PROBES = """
    # (a) what the decision reads, and the project tree: lower the bar of every later
    # comparison (min_gain and sigma_multiple to 0 in the project's config, which the
    # controller reads at every start) and edit a project file
    from pathlib import Path
    def lower_the_bar():
        text = Path(P["config"]).read_text()
        if "min_gain" not in text:   # once: every B worker runs this
            Path(P["config"]).write_text(text.replace(
                "[controller]\\n", "[controller]\\nmin_gain = 0\\nsigma_multiple = 0\\n"))
    attempt("config", lower_the_bar)
    attempt("notes", lambda: open(P["notes"], "a").write("pwned\\n"))
    # (b) the judges' own code: would append an always-adopt `decide()` to stats.py; the
    # probe opens it for appending and writes nothing, so a failure cannot damage it
    attempt("exists", lambda: os.path.exists(P["stats"]))
    attempt("append", lambda: open(P["stats"], "ab").close())
    # (c) sealed material
    attempt("seed", lambda: open(P["seed"]).read())
    attempt("requests", lambda: open(P["requests"]).read()[:40])
    attempt("listing", lambda: os.listdir(P["dir"]))
    # (e) secrets in the environment, its own and its parent's
    def harvest():
        hits = [k for k, v in os.environ.items() if "secret" in v or "leak" in v]
        for pid in (os.getpid(), os.getppid()):
            try:
                data = open(f"/proc/{pid}/environ", "rb").read()
            except OSError:
                continue
            if b"sk-test-do-not-leak" in data or b"also-secret" in data:
                hits.append(f"/proc/{pid}/environ")
        return hits
    attempt("hits", harvest)
    attempt("env", lambda: sorted(os.environ))
    # (f) network: the sealed set sent to a listener on this host
    import socket
    attempt("connect", lambda: socket.create_connection(
        ("127.0.0.1", P["port"]), timeout=5).sendall(b"the sealed set") or "sent")
    # what a confined worker sees (confined only: opted out, HOME is the user's own home)
    if P["view"]:
        attempt("root", lambda: sorted(os.listdir("/")))
        attempt("home", lambda: sorted(os.listdir(os.path.expanduser("~root"))))
        attempt("tmp", lambda: os.listdir("/tmp"))
        attempt("cwd", os.getcwd)
        attempt("HOME", lambda: os.environ["HOME"])
        attempt("project", lambda: os.listdir(P["project"]))
        attempt("repo", lambda: os.listdir(P["repo"]))
        attempt("own checkout", lambda: open("stock/engine.py", "a").write("# edited\\n"))
        attempt("scratch", lambda: Path(os.environ["HOME"], "x").write_text("ok"))
""" + textwrap.indent(COMPILE_PROBES, "    ")


@pytest.fixture(scope="module", params=["confined", "unconfined"])
def probed(request, tmp_path_factory):
    """The PROBES candidate served by one worker, confined or opted out; what it found."""
    from specpilot.requests.sealed import SEED_FILE, default_sealed_dir, ensure_sealed

    tmp = tmp_path_factory.mktemp(f"probes-{request.param}")
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "unconfined":
            mp.setenv(confine.OPT_OUT, "1")
        else:
            mp.delenv(confine.OPT_OUT, raising=False)
        mp.setenv("SPECPILOT_SEALED_DIR", str(tmp / "sealed"))
        mp.setenv("ANTHROPIC_API_KEY", "sk-test-do-not-leak")
        mp.setenv("SPECPILOT_TOKEN", "also-secret")
        project = judge_project(tmp / "proj")
        (project / "NOTES.md").write_text("the project's own notes\n")
        git(project, "add", "NOTES.md")
        git(project, "commit", "-qm", "notes")
        requests = ensure_sealed()
        seed = default_sealed_dir() / SEED_FILE
        stats = Path(specpilot.judges.stats.__file__).resolve()
        stats_before = stats.read_bytes()
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(2.0)
        try:
            rev = candidate(project, "probes", PROBES, stats=str(stats), seed=str(seed),
                            requests=str(requests), dir=str(seed.parent),
                            port=listener.getsockname()[1],
                            config=str(project / ".specpilot" / "config.toml"),
                            notes=str(project / "NOTES.md"),
                            view=request.param == "confined", project=str(project),
                            repo=str(HERE), name="poisoned-entry")
            with serving(project, rev, tmp / "b.log") as w:
                ready = dict(w.ready)
            checkout_kept = tree_hash(w.checkout.path, SYS) == w.checkout.tree
            got = found(tmp / "b.log")
            try:
                conn, _ = listener.accept()
                conn.close()
                accepted = True
            except TimeoutError:
                accepted = False
        finally:
            listener.close()
    return SimpleNamespace(mode=request.param, got=got, stats=stats, stats_before=stats_before,
                           seed=seed, requests=requests, accepted=accepted, project=project,
                           rev=rev, ready=ready, checkout_kept=checkout_kept)


# (a) what the decision reads, and the project tree ---------------------------------------

def test_a_candidate_cannot_rewrite_the_config_or_the_project(probed):
    """B lowers the bar of every later comparison (min_gain and sigma_multiple to 0 in the
    project's config, which the controller reads at every start) and edits a project file
    (PROBES' (a))."""
    project, ready = probed.project, probed.ready
    assert {"config", "notes"} <= set(probed.got)   # the attack ran

    notes = (project / "NOTES.md").read_text()
    cc = load_config(project).controller
    if probed.mode == "confined":
        assert (cc.min_gain, cc.sigma_multiple) == (0.01, 2.0)
        assert notes == "the project's own notes\n"
        assert ready["confined"] == confine.CONFINED
    else:  # the danger of opting out: every later comparison adopts at a zero bar
        assert (cc.min_gain, cc.sigma_multiple) == (0, 0)
        assert notes.endswith("pwned\n")
        assert ready["confined"] == "none: SPECPILOT_UNCONFINED=1"


# (b) the judges' own code --------------------------------------------------------------

@needs_bwrap
def test_b_candidate_cannot_reach_the_installed_judges(probed):
    got = probed.got
    assert probed.stats.read_bytes() == probed.stats_before
    if probed.mode == "confined":
        assert got["exists"] == ["ok", False]
        assert got["append"][0] == "refused"
    else:
        assert got["exists"] == ["ok", True] and got["append"] == ["ok", None]


# (c) sealed material -------------------------------------------------------------------

@needs_bwrap
def test_c_candidate_cannot_read_the_sealed_requests(probed):
    got = probed.got
    if probed.mode == "confined":
        assert {got[k][0] for k in ("seed", "requests", "listing")} == {"refused"}, got
    else:
        assert got["seed"] == ["ok", probed.seed.read_text()]
        assert got["requests"] == ["ok", probed.requests.read_text()[:40]]


# (d) the rival worker ------------------------------------------------------------------

@needs_bwrap
def test_d_candidate_cannot_see_stop_or_renice_the_rival(project, mode, tmp_path):
    """A (stock) is serving; B is handed A's process ids (as an attacker could find them)
    and scans /proc for workers of this project; it sends SIGSTOP and renices to 19."""
    co_a = clean_checkout(GitStore(project), "HEAD", SYS, project)
    a = Worker("A", co_a, SYS, MODEL, {}, "cpu", tmp_path / "a.log")
    a.start()
    rivals = descendants(a.proc.pid)
    try:
        rev = candidate(project, "rival", """
            import signal
            def scan():
                seen = []
                for entry in os.listdir("/proc"):
                    if entry.isdigit() and int(entry) != os.getpid():
                        try:
                            if os.readlink(f"/proc/{entry}/cwd").startswith(P["project"]):
                                seen.append(int(entry))
                        except OSError:
                            pass
                return seen
            attempt("workers_seen", scan)
            for pid in P["rivals"]:
                attempt(f"stop {pid}", lambda: os.kill(pid, signal.SIGSTOP))
                attempt(f"renice {pid}", lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))
            """, rivals=rivals, project=str(project))
        with serving(project, rev, tmp_path / "b.log"):
            states = {p: Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
                      for p in rivals}
            nice = {p: os.getpriority(os.PRIO_PROCESS, p) for p in rivals}
        got = found(tmp_path / "b.log")
        if mode == "confined":
            assert got["workers_seen"] == ["ok", []]
            assert all(got[f"stop {p}"][0] == got[f"renice {p}"][0] == "refused"
                       for p in rivals), got
            assert "T" not in states.values() and set(nice.values()) == {0}
            assert a.run("x", 4, ids=[1, 2, 3]).tokens  # A still serves
        else:
            assert a.proc.pid in got["workers_seen"][1]
            assert states[a.proc.pid] == "T" and nice[a.proc.pid] == 19
    finally:
        for p in rivals:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
        a.stop()


# (e) secrets in the environment --------------------------------------------------------

@needs_bwrap
def test_e_candidate_sees_no_secrets(probed):
    got = probed.got
    if probed.mode == "confined":
        assert got["hits"] == ["ok", []]
        assert not [k for k in got["env"][1] if k.startswith("SPECPILOT_")
                    or k == "ANTHROPIC_API_KEY"]
    else:
        assert "ANTHROPIC_API_KEY" in got["hits"][1] and "SPECPILOT_TOKEN" in got["env"][1]


# (f) network ---------------------------------------------------------------------------

@needs_bwrap
def test_f_candidate_has_no_network(probed):
    if probed.mode == "confined":
        assert probed.got["connect"][0] == "refused" and not probed.accepted
    else:
        assert probed.got["connect"] == ["ok", "sent"] and probed.accepted


# what a confined worker sees -----------------------------------------------------------

@needs_bwrap
@pytest.mark.parametrize("probed", ["confined"], indirect=True)
def test_a_confined_candidate_sees_only_its_checkout_and_scratch(probed):
    """PROBES' view probes (the confined worker's only: opted out, HOME is the user's)."""
    assert probed.mode == "confined"
    ready = probed.ready
    assert probed.checkout_kept   # its edit did not land
    got = probed.got
    assert set(got["root"][1]) <= {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr",
                                   "etc", "dev", "proc", "tmp", "judge", "root", "home"}
    assert got["home"][1] in ([], [".pyenv"])   # only the way to the interpreter, if there
    # a private, empty /tmp; only the way to a Python installation under /tmp (a venv there)
    tmp = Path("/tmp").resolve()
    python_ways = sorted({r.relative_to(tmp).parts[0] for r in confine.python_roots()
                          if tmp in r.parents})
    assert got["tmp"] == ["ok", python_ways]
    assert got["cwd"] == ["ok", str(confine.CHECKOUT)]
    assert got["HOME"] == ["ok", str(confine.SCRATCH)]
    assert got["project"][0] == got["repo"][0] == got["own checkout"][0] == "refused"
    assert got["scratch"] == ["ok", 2]
    assert ready["confined"] == confine.CONFINED


@needs_bwrap
@pytest.mark.parametrize("probed", ["confined"], indirect=True)
def test_a_candidate_feeds_only_its_own_trees_compiles(probed, tmp_path, monkeypatch):
    """Workers of one system tree share its compilers' cache (/judge/compile: torch.compile's,
    Triton's and the W12 mma kernel's nvcc builds), so a GPU worker's compiles become cache
    reads after the first; a file a candidate plants there reaches the next worker of its own
    tree and no worker of another tree (a rival candidate, or stock), whose cache is its own
    tree's. The poisoner is PROBES' candidate: its confined worker (the first of its tree in
    its project) planted; a second worker of it and a rival's follow here."""
    monkeypatch.delenv(confine.OPT_OUT, raising=False)
    project, poisoner = probed.project, probed.rev
    rival = candidate(project, "rival", COMPILE_PROBES, name="rival-entry")
    logs = [tmp_path / f"{i}.log" for i in range(2)]
    for rev, log in zip((poisoner, rival), logs):
        with serving(project, rev, log):
            pass
    first = probed.got
    second, other = (found(log) for log in logs)
    assert first["where"] == ["ok", str(confine.COMPILE / "inductor")]
    assert first["kernels"] == ["ok", str(confine.COMPILE / "kernels")]   # nvcc's builds too
    assert first["seen"] == ["ok", []] and first["plant"] == ["ok", 1]
    assert second["seen"] == ["ok", ["poisoned-entry"]]   # its own tree: shared
    assert other["seen"] == ["ok", []]                     # another tree: never seen


# the policy ----------------------------------------------------------------------------

def test_without_bwrap_a_worker_refuses_to_start_unless_the_user_opts_out(project, tmp_path,
                                                                          monkeypatch):
    monkeypatch.delenv(confine.OPT_OUT, raising=False)
    monkeypatch.setattr(confine, "usable_bwrap", lambda: None)
    co = clean_checkout(GitStore(project), "HEAD", SYS, project)
    w = Worker("B", co, SYS, MODEL, {}, "cpu", tmp_path / "b.log")
    with pytest.raises(SpecPilotError) as exc:
        w.start()
    message = str(exc.value)
    assert "\n" not in message and "apt-get install bubblewrap" in message
    assert confine.OPT_OUT in message and getattr(w, "proc", None) is None
    assert not (tmp_path / "b.log").exists()   # nothing was started

    off = Worker("B", co, SYS, MODEL, {}, "cpu", tmp_path / "off.log", confine=False)
    try:
        assert off.start()["confined"] == "none: [judges] confine = false"
    finally:
        off.stop()
    monkeypatch.setenv(confine.OPT_OUT, "1")
    try:
        assert w.start()["confined"] == "none: SPECPILOT_UNCONFINED=1"
    finally:
        w.stop()


def test_the_judges_config_section(tmp_path):
    (tmp_path / ".specpilot").mkdir()
    cfg = tmp_path / ".specpilot" / "config.toml"
    cfg.write_text("[judges]\nconfine = false\n")
    assert load_config(tmp_path).judges.confine is False
    cfg.write_text("[judges]\nconfined = false\n")
    with pytest.raises(SpecPilotError, match=r"\[judges\] confined: unknown key"):  # forbid
        load_config(tmp_path)
    cfg.write_text("")
    assert load_config(tmp_path).judges.confine is True


def test_a_compiler_outside_the_system_folders_is_mounted_read_only(tmp_path, monkeypatch):
    """Triton builds its launchers with the C compiler: one under e.g. /opt/gcc is shown
    (read-only) by its prefix, and its bin folder stays on the worker's PATH."""
    gcc = tmp_path / "opt" / "gcc" / "bin" / "gcc"
    gcc.parent.mkdir(parents=True)
    gcc.write_text("#!/bin/sh\n")
    gcc.chmod(0o755)
    monkeypatch.setenv("CC", str(gcc))
    monkeypatch.setenv("PATH", f"{gcc.parent}:/usr/bin:/bin")
    argv = confine.command(["python", "w.py"], Path("w.py"), tmp_path, tmp_path)
    prefix = str(gcc.parent.parent)
    assert any(argv[i:i + 3] == ["--ro-bind", prefix, prefix] for i in range(len(argv)))
    path = argv[argv.index("PATH", argv.index("--setenv")) + 1]
    assert str(gcc.parent) in path.split(":")
    assert argv[argv.index("CC") + 1] == str(gcc)
