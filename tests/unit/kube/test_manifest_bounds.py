"""Loading a manifest is bounded: alias expansion, size and nesting are measured before anything is
built from the YAML, and a key given twice in one mapping is an error (it says two things; kubectl would silently keep the last).
A refused manifest never leaves a run behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_sandbox.kube.api.resources import API_VERSION
from durable_sandbox.kube.spec.manifests import (
    MAX_EXPANDED_NODES,
    MAX_MANIFEST_BYTES,
    ManifestError,
    load_manifests,
)
from durable_sandbox.kube.spec.models import WorkflowResource
from tests.dsb import dsb

HEAD = f"apiVersion: {API_VERSION}\nkind: Workflow\nmetadata:\n  name: demo\nspec:\n"
CALLS = "  toolCalls:\n    - {type: shell, command: echo hi}\n"


def alias_bomb(levels: int, fanout: int = 10) -> str:
    """Each level is a list of `fanout` aliases of the previous one: fanout**levels leaves from a few
    hundred bytes of YAML (the "billion laughs" shape)."""
    lines = ["  signals:", '    l0: &l0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]")
    return HEAD + CALLS + "\n".join(lines) + "\n"


def problems(text: str) -> list[str]:
    with pytest.raises(ManifestError) as info:
        load_manifests(text)
    return info.value.problems


def test_alias_bomb_is_refused_before_it_is_expanded() -> None:
    text = alias_bomb(6)  # a million leaves
    assert len(text) < 600
    (problem,) = problems(text)
    assert problem.startswith("<manifest>: document 1: expands to more than")
    assert str(MAX_EXPANDED_NODES) in problem and "aliases" in problem


def test_alias_repeating_a_large_scalar_is_refused() -> None:
    big = "x" * 100_000
    text = HEAD + CALLS + f"  signals:\n    a: &a {big}\n" + "".join(f"    b{i}: *a\n" for i in range(40))
    (problem,) = problems(text)
    assert f"more than {MAX_MANIFEST_BYTES} bytes" in problem


def test_moderate_anchors_are_accepted_as_kubectl_accepts_them() -> None:
    text = HEAD + (
        "  signals:\n"
        "    base: &base {approved: true, by: ops}\n"
        "    again: *base\n"
        "    merged:\n"
        "      <<: *base\n"
        "      by: security\n"  # a merged key may be overridden: YAML merge semantics
        "  toolCalls:\n"
        "    - &echo {type: shell, command: echo hi}\n"
        "    - *echo\n"
    ).replace("*echo\n", "{type: shell, command: echo again}\n")
    (wf,) = load_manifests(text)
    assert isinstance(wf, WorkflowResource)
    assert wf.spec.signals["again"] == {"approved": True, "by": "ops"}
    assert wf.spec.signals["merged"] == {"approved": True, "by": "security"}


@pytest.mark.parametrize(
    ("body", "key", "line"),
    [
        ("  toolCalls:\n    - {type: shell, command: a, command: b}\n", "command", 7),
        (CALLS + "  snapshotEveryNCalls: 1\n  snapshotEveryNCalls: 2\n", "snapshotEveryNCalls", 9),
        (CALLS + "  signals:\n    go: 1\n    go: 2\n", "go", 10),
    ],
)
def test_duplicate_keys_are_rejected(body: str, key: str, line: int) -> None:
    (problem,) = problems(HEAD + body)
    assert problem.startswith(f"<manifest>: invalid YAML: line {line}, column ")
    assert f"duplicate key {key!r}" in problem


def test_oversized_manifest_is_refused_without_parsing() -> None:
    text = HEAD + CALLS + "  signals:\n    blob: " + "y" * MAX_MANIFEST_BYTES + "\n"
    (problem,) = problems(text)
    assert "is larger than a manifest may be" in problem


@pytest.mark.parametrize("depth", [150, 5000])
def test_deep_nesting_is_a_clear_error(depth: int) -> None:
    text = HEAD + CALLS + "  signals:\n    deep: " + "[" * depth + "]" * depth + "\n"
    (problem,) = problems(text)
    assert "nest" in problem, problem


def test_dsb_run_refuses_an_alias_bomb_and_creates_no_run(tmp_path: Path) -> None:
    manifest = tmp_path / "bomb.yaml"
    manifest.write_text(alias_bomb(7))
    store = tmp_path / "runs.db"
    result = dsb("--store", str(store), "run", str(manifest))
    assert result.exit_code == 2, result.output
    assert "expands to more than" in result.stderr
    # Refused before anything was written: not even the store file exists (so `dsb --store` it is an error).
    assert not store.exists()
    listed = dsb("--store", str(store), "-o", "json", "runs")
    assert listed.exit_code == 2 and "no such store file" in listed.stderr, listed.output
