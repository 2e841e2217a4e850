"""A manifest the docs show is the manifest the tests apply: a YAML block of README.md or docs/*.md holding an
object of the same kind and name as one in examples/ must be that object, field for field (comments aside), so
a reader who copies it from the page runs what the e2e tests ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.docs_commands import ROOT, blocks, docs


def _examples() -> dict[tuple[str, str], list[tuple[Path, dict[str, Any]]]]:
    found: dict[tuple[str, str], list[tuple[Path, dict[str, Any]]]] = {}
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "kind" in doc:
                key = (doc["kind"], str((doc.get("metadata") or {}).get("name")))
                found.setdefault(key, []).append((path.relative_to(ROOT), doc))
    return found


def test_every_example_object_the_docs_show_is_the_example_as_it_is() -> None:
    examples = _examples()
    shown, differ = 0, []
    for path in docs():
        for block in blocks(path):
            if block.lang not in ("yaml", "yml"):
                continue
            for doc in yaml.safe_load_all(block.body):
                if not isinstance(doc, dict) or "kind" not in doc:
                    continue
                key = (doc["kind"], str((doc.get("metadata") or {}).get("name")))
                if key not in examples:
                    continue
                shown += 1
                if all(doc != ex for _, ex in examples[key]):
                    differ.append(f"{block.doc}:{block.line}: {key[0]} {key[1]} differs from "
                                  + ", ".join(str(p) for p, _ in examples[key]))
    assert not differ, "the docs show an example other than the one the tests apply:\n" + "\n".join(differ)
    assert shown >= 8, f"only {shown} example objects found in the docs: has the block format changed?"
