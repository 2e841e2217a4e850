"""A local-only command with --kube is a usage error that names every command --kube has, as docs/cli.md lists
them (it left out ``sandboxes``, which exists only with --kube)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.dsb import ROOT, dsb


def kube_commands_in_docs() -> set[str]:
    row = next(line for line in (ROOT / "docs" / "cli.md").read_text().splitlines() if line.startswith("| `--kube` |"))
    return set(re.findall(r"`([a-z]+)`", row))  # the commands; `--kube` itself has hyphens


def test_a_local_only_command_with_kube_names_every_kube_command(tmp_path: Path) -> None:
    done = dsb("--kube", "worker", env={"KUBECONFIG": str(tmp_path / "missing")}, process=True)
    assert done.returncode == 2, done.stdout + done.stderr
    named = set(re.search(r"with --kube: ([a-z, ]+)\)", done.stderr).group(1).split(", "))  # type: ignore[union-attr]
    documented = kube_commands_in_docs()
    assert "sandboxes" in documented and {"run", "runs", "signal"} <= documented
    assert named == documented, done.stderr
