"""Confinement of every process that imports a candidate's code (bubblewrap).

`command()` wraps a worker's argv in bubblewrap: a new mount tree holding only what the
worker needs, read-only (the Python installation, the system's libraries and a few files
of /etc, the worker program at /judge/worker_main.py, the candidate's clean checkout at
/judge/checkout, the model files), a private tmpfs /tmp, a private writable scratch at
/judge/scratch (HOME) and, writable, the compilers' caches of its checkout's tree at
/judge/compile (torch.compile's, Triton's and nvcc's builds of kernels/: every worker of
one system tree compiles into and reads from the same folder, and no worker of another
tree sees it, so a candidate can only ever feed its own compiles). Every namespace is new:
no network, its own PID and IPC namespace (two workers cannot see or signal each other).
The environment is cleared and rebuilt from an allow-list: no API keys, no SPECPILOT_*
variables. Nothing of the project tree, the judges' caches (σ, references), the sealed
set, other checkouts or any home folder is mounted; requests reach the worker only through
its pipe.

`policy()` decides: confined by default; where bwrap is missing or broken it refuses
unless the user opted out (`SPECPILOT_UNCONFINED=1`, or `[judges] confine = false`).
"""

from __future__ import annotations

import glob
import os
import shutil
import site
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from specpilot.errors import SpecPilotError

JUDGE = Path("/judge")
CHECKOUT = JUDGE / "checkout"
PROGRAM = JUDGE / "worker_main.py"
SCRATCH = JUDGE / "scratch"
COMPILE = JUDGE / "compile"
MODEL_CACHE = SCRATCH / "cache" / "specpilot" / "models"  # where stock looks for converted GGUFs
OPT_OUT = "SPECPILOT_UNCONFINED"
CONFINED = "bubblewrap"

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
       "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/localtime")
SYS = ("/sys/devices", "/sys/bus", "/sys/class", "/sys/dev")   # device topology (CUDA, NVML)
ENV_PASS = ("LANG", "LC_ALL", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_DEVICE_ORDER",
            "CUDA_MODULE_LOADING", "CUDA_HOME", "LD_LIBRARY_PATH", "CC", "CXX",
            "TRITON_INTERPRET", "TRITON_LIBCUDA_PATH", "TRITON_PTXAS_PATH")


@lru_cache(maxsize=1)
def usable_bwrap() -> str | None:
    """bwrap's path if it exists and can build a sandbox like ours here, else None."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    try:
        probe = subprocess.run([path, "--unshare-all", "--die-with-parent", "--ro-bind", "/",
                                "/", "--dev", "/dev", "--proc", "/proc", "true"],
                               capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if probe.returncode == 0 else None


def policy(confine: bool = True) -> str:
    """"bubblewrap" when workers run confined, "none: <why>" when the user opted out;
    raises when confinement is wanted and bwrap cannot provide it."""
    if os.environ.get(OPT_OUT) == "1":
        return f"none: {OPT_OUT}=1"
    if not confine:
        return "none: [judges] confine = false"
    if usable_bwrap() is None:
        raise SpecPilotError(
            "candidate code must run confined but bubblewrap is missing or does not work "
            "here: install it (apt-get install bubblewrap), or opt out with "
            f"{OPT_OUT}=1 or [judges] confine = false (candidates then run with your rights)")
    return CONFINED


def outer_env() -> dict[str, str]:
    """bwrap's own environment: what it may need to load (a bwrap unpacked beside the
    system finds its libraries through LD_LIBRARY_PATH), nothing else. The sandbox's
    init process keeps this environment, and the worker can read it (/proc/1/environ)."""
    return {k: os.environ[k] for k in ("LD_LIBRARY_PATH",) if k in os.environ}


def python_roots() -> list[Path]:
    """The interpreter's installation and site-packages, outermost folders only."""
    found = {Path(p).resolve() for p in (sys.base_prefix, sys.prefix, *site.getsitepackages())}
    found.add(Path(sys.executable).resolve().parent)
    return sorted(p for p in found if not any(q in p.parents for q in found))


def _toolchain() -> list[Path]:
    """The install prefix of the C compiler (Triton builds its launchers with it) when it
    lives outside the system folders, e.g. /opt/gcc."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        found = shutil.which(name) if name else None
        if found:
            real = Path(found).resolve()
            prefix = real.parent.parent
            seen = any(Path(s) in real.parents for s in SYSTEM)
            return [] if seen or prefix in (Path("/"), Path.home()) else [prefix]
    return []


def _ro(path: str | Path, inside: str | Path | None = None) -> list[str]:
    """Mount `path` read-only (a symlink stays a symlink), or nothing if it is absent."""
    path = Path(path)
    if path.is_symlink() and inside is None:
        return ["--symlink", os.readlink(path), str(path)]
    if not path.exists():
        return []
    return ["--ro-bind", str(path), str(inside or path)]


def command(argv: list[str], program: Path, checkout: Path, scratch: Path,
            reads: list[tuple[Path, Path]] = (), device: str = "cpu",
            env: dict[str, str] | None = None, compile_cache: Path | None = None) -> list[str]:
    """bwrap argv running `argv` (whose element `program` is seen as /judge/worker_main.py)
    on `checkout` with `scratch` as its writable folder, and `compile_cache` (the compile
    cache of the checkout's tree; default: inside scratch) as /judge/compile. `reads`: (host
    path, path the worker sees) pairs mounted read-only, e.g. the model. Open file
    descriptors the caller passes (the result pipe) are inherited through bwrap unchanged."""
    args = [usable_bwrap() or "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
            "--clearenv"]
    # the private /tmp first: a Python installation under /tmp (a CI runner's venv) is
    # mounted over it afterwards, not hidden by it
    args += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for path in SYSTEM + ETC:
        args += _ro(path)
    roots = python_roots() + _toolchain()
    for root in roots:
        args += _ro(root)
    if device.startswith("cuda"):
        for node in sorted(glob.glob("/dev/nvidia*")):
            args += ["--dev-bind", node, node]
        for path in SYS:
            args += _ro(path)
    args += _ro(program, PROGRAM) + ["--ro-bind", str(checkout), str(CHECKOUT)]
    args += ["--bind", str(scratch), str(SCRATCH)]
    caches = SCRATCH / "cache"
    if compile_cache is not None:
        args += ["--bind", str(compile_cache), str(COMPILE)]
        caches = COMPILE
    for host, inside in reads:
        args += _ro(host, inside)
    inner = {k: os.environ[k] for k in ENV_PASS if k in os.environ}
    path = [str(Path(sys.executable).parent)] + [  # our PATH's entries that it can see
        p for p in os.environ.get("PATH", "").split(":")
        if p and any(Path(r) == Path(p) or Path(r) in Path(p).parents
                     for r in (*roots, *SYSTEM))] + ["/usr/bin", "/bin"]
    inner.update(PATH=":".join(dict.fromkeys(path)),
                 HOME=str(SCRATCH), TMPDIR="/tmp", USER="judge", LOGNAME="judge",
                 XDG_CACHE_HOME=str(SCRATCH / "cache"),
                 TRITON_CACHE_DIR=str(caches / "triton"),
                 TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
                 KERNELS_CACHE_DIR=str(caches / "kernels"),   # kernels/w12/mma.py's nvcc builds
                 PYTHONPATH=str(CHECKOUT), PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1")
    inner.update(env or {})
    for name, value in sorted(inner.items()):
        args += ["--setenv", name, value]
    args += ["--chdir", str(CHECKOUT), "--"]
    return args + [str(PROGRAM) if a == str(program) else a for a in argv]
