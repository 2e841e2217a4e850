"""The web view in a real browser: `dsb ui` as users start it, and Debian's headless Chromium driven by
Playwright (its own browser download is never used: scripts/browser installs Debian's package).

Screenshots of the pages the tests check are written to ``$DSB_UI_SCREENSHOTS`` (docs/ui.md shows the
ones made with ``DSB_UI_SCREENSHOTS=docs/ui``), else under the test's tmp dir.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.controlplane import wait_until
from tests.e2e.readme_install_support import extra_for, readme_dsb

ROOT = Path(__file__).resolve().parents[2]
BROWSER_SCRIPT = ROOT / "scripts" / "browser"
# What the machine's closed network needs (background networking would be refused, many times over), and
# what running as root in a container needs (no sandbox).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1280, "height": 860}
URL_LINE = re.compile(r"^dsb ui: (http://\S+/runs\?token=(\S+))$", re.M)

_chromium: Path | Exception | None = None


def chromium() -> Path:
    """scripts/browser once per session (installs Debian's chromium if missing); a failure is remembered."""
    global _chromium
    if _chromium is None:
        try:
            out = subprocess.run([str(BROWSER_SCRIPT)], stdout=subprocess.PIPE, text=True, timeout=1800, check=True)
            _chromium = Path(out.stdout.strip().splitlines()[-1])
        except Exception as exc:
            _chromium = exc
    if isinstance(_chromium, Exception):
        raise RuntimeError(f"scripts/browser failed: {_chromium}") from _chromium
    return _chromium


def launch_browser() -> Iterator[Any]:
    """Chromium for the ``browser`` fixture of tests/e2e/conftest.py (Playwright's sync API allows one
    instance at a time in a thread)."""
    from playwright.sync_api import sync_playwright

    path = chromium()
    with sync_playwright() as pw:
        # launch() gives every session a fresh, empty profile (user-data-dir) of its own.
        b = pw.chromium.launch(executable_path=str(path), headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@dataclass
class Page:
    """A browser tab that fails the test on a script error or a failed request to the server."""

    page: Any
    errors: list[str] = field(default_factory=list)

    def check(self) -> None:
        assert not self.errors, "\n".join(self.errors)


@pytest.fixture
def tab(browser: Any) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    out = Page(page)
    page.on("pageerror", lambda exc: out.errors.append(f"page error: {exc}"))
    page.on("console", lambda msg: out.errors.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    page.on("response", lambda r: out.errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.set_default_timeout(30_000)
    try:
        yield out
    finally:
        context.close()


def screenshots_dir(tmp_path: Path) -> Path:
    given = os.environ.get("DSB_UI_SCREENSHOTS")
    path = (ROOT / given) if given and not Path(given).is_absolute() else Path(given) if given else tmp_path / "shots"
    path.mkdir(parents=True, exist_ok=True)
    return path


def shoot(page: Any, directory: Path, name: str, *, full: bool = False) -> Path:
    """A screenshot of what the test just checked: the viewport, or with ``full`` the page from its top, up
    to 1,400 px (kept small: docs/ui.md shows them)."""
    path = directory / f"{name}.png"
    if full:
        height = min(int(page.evaluate("document.documentElement.scrollHeight")), 1400)
        page.screenshot(path=str(path), full_page=True,
                        clip={"x": 0, "y": 0, "width": VIEWPORT["width"], "height": height})
    else:
        page.screenshot(path=str(path))
    return path


@dataclass
class UiServer:
    """`dsb ui` running as a user starts it; ``url`` is the address it printed (with its token)."""

    process: subprocess.Popen[str]
    url: str
    token: str
    log: Path

    @property
    def base(self) -> str:
        return self.url.split("/runs?", 1)[0]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # Ctrl-C, as a user stops it
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_ui(global_args: tuple[str, ...], ui_args: tuple[str, ...], *, env: dict[str, str] | None = None) -> UiServer:
    """`dsb GLOBAL_ARGS ui UI_ARGS`, from an environment installed as the docs install it (see
    tests/e2e/readme_install_support.py: a dependency the web view needs and the install misses fails here),
    until it prints its URL."""
    log = Path(tempfile.mkstemp(prefix="dsb-ui-", suffix=".log")[1])
    with log.open("w") as out:
        proc = subprocess.Popen([str(readme_dsb(extra_for(global_args))), *global_args, "ui", *ui_args], stdout=out, stderr=subprocess.STDOUT, text=True,
                                cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                                start_new_session=True)

    def printed() -> re.Match[str] | None:
        if proc.poll() is not None:
            raise AssertionError(f"dsb ui exited with {proc.returncode}:\n{log.read_text()}")
        return URL_LINE.search(log.read_text())

    found = wait_until(printed, 90, "dsb ui to print its URL")
    return UiServer(proc, found[1], found[2], log)


@pytest.fixture
def ui_servers() -> Iterator[Any]:
    """A factory of `dsb ui` servers (``start(global_args, ui_args)``); each is stopped with Ctrl-C at the end,
    and must exit cleanly."""
    started: list[UiServer] = []

    def start(global_args: tuple[str, ...] = (), ui_args: tuple[str, ...] = (), *,
              env: dict[str, str] | None = None) -> UiServer:
        server = start_ui(global_args, ui_args, env=env)
        started.append(server)
        return server

    yield start
    for server in started:
        code = server.stop()
        assert code == 0, f"dsb ui exited with {code} on Ctrl-C:\n{server.log.read_text()[-4000:]}"


def timeline_rows(page: Any) -> list[tuple[str, str, str]]:
    """The timeline rows the page shows, in order: (kind, outcome, label)."""
    rows: list[tuple[str, str, str]] = page.eval_on_selector_all(
        "#tl-list .tr", "els => els.sort((a, b) => a.offsetTop - b.offsetTop).map(e => "
                        "[e.dataset.kind, e.dataset.outcome, e.querySelector('.tl').firstChild.textContent])")
    return [tuple(r) for r in rows]  # type: ignore[misc]


def header_fact(page: Any, name: str) -> str:
    """What the run page's header says for ``name`` (the <dd> after the <dt> ``name``)."""
    text: str | None = page.evaluate(
        "name => { const dt = [...document.querySelectorAll('.run-head dt')].find(e => e.textContent === name);"
        " return dt ? dt.nextElementSibling.textContent : null; }", name)
    assert text is not None, f"no {name!r} in the run page's header"
    return text
