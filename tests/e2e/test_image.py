"""The operator image, built from the repository's Dockerfile (scripts/image-build: a Debian base made with
mmdebstrap under the Dockerfile's FROM name, buildah with chroot isolation; no test-only Dockerfile).

What the image promises (docs/operations.md): a non-root numeric UID, `dsb operator` as entrypoint, OCI labels,
the operator's dependencies importable, and no pip, compilers, apt lists or caches in the final stage.
The image running as the Helm chart's Pod on a real node is in test_chart_on_node.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .image_support import Image, build_image, container, run_in

pytestmark = pytest.mark.image


@pytest.fixture(scope="module")
def image() -> Image:
    return build_image()


@pytest.fixture(scope="module")
def ctr(image: Image) -> Iterator[str]:
    with container(image) as name:
        yield name


def test_image_config(image: Image) -> None:
    config = image.config()
    assert config["User"] == "10001:10001", "a numeric non-root UID, so runAsNonRoot can be verified"
    assert config["Entrypoint"] == ["dsb", "operator"]
    assert "8080/tcp" in config.get("ExposedPorts", {})
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["DURABLE_SANDBOX_HOME"] == "/var/lib/durable-sandbox"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == "durable-sandbox"
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert len(labels["org.opencontainers.image.revision"]) == 40, "the commit the image was built from"
    print(f"\nimage {image.name}: {image.size()}, scripts/image-build took {image.build_seconds:.0f} s")


def test_runs_as_the_non_root_uid_with_its_dependencies(ctr: str) -> None:
    proc = run_in(ctr, ["id", "-u"])
    assert proc.stdout.split()[-1:] == ["10001"], f"stdout: {proc.stdout!r}\nstderr: {proc.stderr}"
    proc = run_in(ctr, ["dsb", "operator", "--help"])
    assert proc.returncode == 0 and "--metrics-port" in proc.stdout, proc.stdout + proc.stderr
    proc = run_in(ctr, ["dsb", "--version"])
    assert proc.returncode == 0 and "0.1.0" in proc.stdout, proc.stderr
    # `dsb operator --help` imports little; the operator's Pod imports every module of kube/ (its journals, its
    # providers' clients) when it starts, so a dependency missing from the image would only show as a crash loop.
    imports = ("import importlib, pkgutil, durable_sandbox.kube as k\n"
               "for m in pkgutil.walk_packages(k.__path__, 'durable_sandbox.kube.'):\n"
               "    importlib.import_module(m.name)\n"
               "print('ok')")
    proc = run_in(ctr, ["python", "-c", imports])
    assert proc.stdout.strip() == "ok", proc.stderr


def test_final_stage_has_no_build_tools_or_caches(ctr: str) -> None:
    script = (
        "import os, shutil, glob\n"
        "print([t for t in ('pip', 'pip3', 'gcc', 'cc', 'make', 'ld') if shutil.which(t)])\n"
        "print(sorted(os.listdir('/var/lib/apt/lists')) if os.path.isdir('/var/lib/apt/lists') else [])\n"
        "print(glob.glob('/root/.cache/pip') + glob.glob('/opt/durable-sandbox/lib/python3*/site-packages/pip')"
        " + [w for d in ('/opt', '/usr', '/root', '/tmp', '/var', '/wheels') for w in glob.glob(d + '/**/*.whl',"
        " recursive=True)] + glob.glob('/src') + glob.glob('/wheels'))\n"
    )
    proc = run_in(ctr, ["python", "-c", script], user="0:0")
    assert proc.returncode == 0, proc.stderr
    tools, lists, leftovers = proc.stdout.strip().splitlines()
    assert tools == "[]", f"build tools in the final image: {tools}"
    assert lists in ("[]", "['partial']"), f"apt lists left in the image: {lists}"
    assert leftovers == "[]", f"caches or build leftovers in the final image: {leftovers}"
