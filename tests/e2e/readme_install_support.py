"""`dsb` from an environment installed exactly as the docs install it, for the browser tests' `dsb ui`.

The test environment has every extra (scripts/test installs ``.[test,agents,bench]``), so a dependency the web
view needs but ``pip install -e .`` does not bring (python-multipart, for its forms) would never fail a test run
there. The browser tests run `dsb ui` from a separate venv instead, made as README.md says
(``python3 -m venv .venv && . .venv/bin/activate && pip install -e .``), with only the extra the docs name for a
mode: none locally, ``[kubernetes]`` for ``dsb --kube`` (docs/kubernetes.md), ``[postgres]`` for a PostgreSQL
store (docs/cli.md). Each is kept under ``.venv-readme/`` and made again only when pyproject.toml changes (its
content hash names it), so a run after the first costs nothing; an editable install, so it runs this tree's code.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".venv-readme"
INSTALL_TIMEOUT_S = 1800

__all__ = ["extra_for", "readme_dsb"]


def extra_for(global_args: tuple[str, ...]) -> str:
    """The extra the docs install for `dsb GLOBAL_ARGS ui`: ``kubernetes`` with ``--kube``, ``postgres`` for a
    ``--store postgresql://`` URL, else none."""
    if "--kube" in global_args:
        return "kubernetes"
    if any(a.startswith(("postgresql://", "postgres://")) for a in global_args):
        return "postgres"
    return ""


def readme_dsb(extra: str = "") -> Path:
    """The `dsb` of a venv made by ``pip install -e .`` (or ``-e '.[extra]'``) of this tree, made if missing."""
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    venv = CACHE / f"{extra or 'base'}-{digest}"
    dsb = venv / "bin" / "dsb"
    ready = venv / ".installed"
    if ready.exists():
        return dsb
    CACHE.mkdir(exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session (or xdist worker) may be making the same one
        if ready.exists():
            return dsb
        for old in CACHE.glob(f"{extra or 'base'}-*"):
            shutil.rmtree(old, ignore_errors=True)  # made from an older pyproject.toml
        target = f"{ROOT}[{extra}]" if extra else str(ROOT)
        steps = [[sys.executable, "-m", "venv", str(venv)],
                 [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", target]]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"making the README's environment failed: {' '.join(step)}: exit "
                                   f"{done.returncode}\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
        ready.touch()
    return dsb
