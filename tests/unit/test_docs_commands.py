"""Issue 24, item 9: every shell command in a code block of README.md and docs/*.md is run by a test or says why
no test here can run it (tests/docs_commands.py), so a doc cannot gain a command nobody tried."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.docs_commands import PROOFS, ROOT, SHELL, TRANSCRIPT, NotRun, Run, all_commands, blocks, docs


def test_every_code_block_says_what_it_holds() -> None:
    untagged = [f"{b.doc}:{b.line}" for path in docs() for b in blocks(path) if not b.lang]
    assert not untagged, (
        f"code blocks without a language: {untagged}; tag each `sh` (commands), `console` (a transcript: `$ ` "
        "lines are commands) or `text` (output, listings), so tests/docs_commands.py knows what to check")


def test_every_doc_command_is_run_by_a_test_or_says_why_not() -> None:
    commands = all_commands()
    assert sum(1 for path in docs() for b in blocks(path) if b.lang in SHELL | TRANSCRIPT) >= 40
    missing = [f"{c.doc}:{c.line}: {c.text!r}" for c in commands if c.text not in PROOFS.get(c.doc, {})]
    assert not missing, (
        "commands in the docs that no test runs and that do not say why (add each to PROOFS in "
        "tests/docs_commands.py: Run(<the test that runs it>) or NotRun(<why it cannot be run here>)):\n"
        + "\n".join(missing))
    present = {(c.doc, c.text) for c in commands}
    stale = [f"{doc}: {text!r}" for doc, proofs in PROOFS.items() for text in proofs if (doc, text) not in present]
    assert not stale, "PROOFS names commands no doc has any more (remove them or fix the text):\n" + "\n".join(stale)


def test_every_proof_names_a_test_that_exists_or_a_reason() -> None:
    problems = []
    for doc, proofs in PROOFS.items():
        for text, proof in proofs.items():
            if isinstance(proof, NotRun):
                if len(proof.why.split()) < 5:
                    problems.append(f"{doc}: {text!r}: say why it cannot be run here, in a sentence")
                continue
            assert isinstance(proof, Run)
            file, _, name = proof.by.partition("::")
            path = ROOT / file
            functions = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)} \
                if path.is_file() else set()
            if name not in functions:
                problems.append(f"{doc}: {text!r}: {proof.by} is not a test function")
    assert not problems, "\n".join(problems)


def test_the_parser_reads_continuations_heredocs_comments_and_transcripts(tmp_path: Path) -> None:
    from tests.docs_commands import Block, block_commands

    sh = Block("x.md", 1, "sh", "a --b \\\n  --c   # why\n# only a comment\n\ncat <<'EOF' # in\nbody # kept\nEOF\nd '#x' # y\n")
    assert [c.text for c in block_commands(sh)] == ["a --b \\\n  --c", "cat <<'EOF'\nbody # kept\nEOF", "d '#x'"]
    console = Block("x.md", 1, "console", "$ dsb wait r\nrun r succeeded\n$ echo $?\n0\n")
    assert [(c.text, c.output) for c in block_commands(console)] == [
        ("dsb wait r", ("run r succeeded",)), ("echo $?", ("0",))]
    assert block_commands(Block("x.md", 1, "text", "$ not a command\n")) == []


def test_the_approval_workflow_shown_is_the_example_file_the_commands_apply() -> None:
    """docs/kubernetes.md shows examples/approve-workflow.yaml and its commands apply that file: the two agree."""
    import yaml

    shown = next(b for b in blocks(ROOT / "docs" / "kubernetes.md") if b.lang == "yaml" and "name: approve" in b.body)
    assert yaml.safe_load(shown.body) == yaml.safe_load((ROOT / "examples" / "approve-workflow.yaml").read_text())
