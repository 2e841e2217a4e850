"""The web view's templates and assets ship in the wheel: every file under ui/templates and ui/static is
matched by pyproject.toml's package data (a new asset with another extension would otherwise be left out
of the wheel, and `dsb ui` would serve a page without it: nothing is ever fetched from elsewhere)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "durable_sandbox"


def test_every_template_and_asset_is_package_data() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["durable_sandbox"]
    files = [p.relative_to(PACKAGE).as_posix() for d in ("ui/templates", "ui/static") for p in (PACKAGE / d).rglob("*")
             if p.is_file()]
    assert {"ui/templates/run.html", "ui/static/app.js", "ui/static/app.css"} <= set(files)
    missing = [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"


def test_the_pages_load_nothing_from_elsewhere() -> None:
    """No template or asset names another host: scripts, styles and fonts come from the server itself."""
    for path in [*(PACKAGE / "ui" / "templates").glob("*.html"), *(PACKAGE / "ui" / "static").iterdir()]:
        text = path.read_text()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, path
