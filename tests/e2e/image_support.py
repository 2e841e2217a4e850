"""The operator image, built from the repository's Dockerfile by scripts/image-build (buildah, chroot isolation),
and commands run from it without a container runtime (``buildah run`` with chroot isolation, as a given UID, with
given env and read-only bind mounts) to inspect its contents. The operator running from it as a real Pod is
tests/e2e/test_chart_on_node.py."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "image-build"
BUILD_TIMEOUT_S = 40 * 60


@dataclass(frozen=True)
class Image:
    name: str
    build_seconds: float

    def config(self) -> dict[str, Any]:
        out = subprocess.run(
            ["buildah", "inspect", "--type", "image", self.name], capture_output=True, text=True, check=True
        ).stdout
        config: dict[str, Any] = json.loads(out)["OCIv1"]["config"]
        return config

    def size(self) -> str:
        """The unpacked size, as buildah prints it (e.g. "354 MB")."""
        out = subprocess.run(
            ["buildah", "images", "--json", self.name], capture_output=True, text=True, check=True
        ).stdout
        return str(json.loads(out)[0]["size"])


_built: Image | Exception | None = None


def build_image() -> Image:
    """scripts/image-build once per session (the base rootfs and buildah's layers are cached). The e2e conftest
    calls it after collection when tests marked ``image`` are selected, so the build never counts against a
    test's timeout; a failure is remembered and raised by every test that needs the image."""
    global _built
    if _built is None:
        start = time.monotonic()
        try:
            proc = subprocess.run(
                [str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, timeout=BUILD_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            _built = RuntimeError(f"scripts/image-build did not complete: {exc}")
        else:
            if proc.returncode != 0:
                _built = RuntimeError(f"scripts/image-build failed with exit code {proc.returncode} (see its stderr)")
            else:
                _built = Image(proc.stdout.strip().splitlines()[-1], time.monotonic() - start)
    if isinstance(_built, Exception):
        raise _built
    return _built


@contextmanager
def container(image: Image) -> Iterator[str]:
    """A working container of the image (``buildah from``), removed afterwards."""
    name = subprocess.run(
        ["buildah", "from", "--pull=never", image.name], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        yield name
    finally:
        subprocess.run(["buildah", "rm", name], capture_output=True, check=False)


def run_args(
    ctr: str,
    argv: Sequence[str],
    *,
    user: str,
    env: dict[str, str] | None = None,
    mounts: dict[Path, str] | None = None,
) -> list[str]:
    cmd = ["buildah", "run", "--isolation", "chroot", "--user", user]
    for key, value in (env or {}).items():
        cmd += ["--env", f"{key}={value}"]
    for host, target in (mounts or {}).items():
        cmd += ["-v", f"{host}:{target}"]
    return [*cmd, ctr, "--", *argv]


def run_in(ctr: str, argv: Sequence[str], *, user: str = "10001:10001", **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(run_args(ctr, argv, user=user, **kw), capture_output=True, text=True, timeout=300,
                          check=False)
