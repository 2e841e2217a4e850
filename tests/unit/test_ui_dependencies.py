"""The web view runs on a plain ``pip install durable-sandbox``: every module it imports, serving every kind of
request (pages, the timeline's JSON, static assets, an action's form), belongs to a distribution that the
package's base dependencies bring (no extra). The test environment has every extra installed, so a missing
declaration (python-multipart, which starlette's form parsing needs) would otherwise only show on a user's
install, as a 500 on every button. (The browser tests run `dsb ui` from such an install: tests/e2e.)"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.dsb import ROOT

# Imported when installed, done without otherwise (``try: import ... except ModuleNotFoundError``).
OPTIONAL = {"sniffio": "anyio and httpx's ASGI transport use it if it is there, asyncio otherwise"}
# Run in a fresh interpreter: what `dsb ui` loads (the CLI, the server), then requests of every kind through the
# app; prints the modules imported after the test's own client (httpx) was, and what the action answered.
SERVE = r"""
import asyncio, json, re, sys
import httpx

before = set(sys.modules)

async def main(home):
    import durable_sandbox
    import durable_sandbox.cli.main, durable_sandbox.ui.server
    from durable_sandbox.runs.session import Settings
    from durable_sandbox.stores import SqliteStore
    from durable_sandbox.ui.app import create_app
    from durable_sandbox.ui.local import LocalSource
    from durable_sandbox.ui.security import Guard
    from examples.flows.hello_flow import hello

    store = SqliteStore(f"{home}/runs.db")
    engine = durable_sandbox.Engine(store, worker_id="deps")
    state = await engine.run(hello, {"name": "Ada", "approve": True}, run_id="deps")
    assert state.status == "waiting", state
    app = create_app(LocalSource(engine, Settings(store=f"{home}/runs.db", store_given=True)),
                     Guard("127.0.0.1", 41999, "t" * 20, allow_actions=True))
    base = "http://127.0.0.1:41999"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base,
                                 headers={"authorization": "Bearer " + "t" * 20, "origin": base}) as c:
        codes = {}
        for path in ("/runs", "/run?id=deps", "/api/timeline?id=deps", "/sandboxes", "/static/app.js",
                     "/static/app.css"):
            codes[path] = (await c.get(path)).status_code
        page = (await c.get("/run?id=deps")).text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)[1]
        form = {"id": "deps", "callback": "approval", "value": "true", "csrf": csrf, "confirmed": "yes"}
        codes["POST /action/signal"] = (await c.post("/action/signal", data=form)).status_code
    await engine.aclose()
    await store.close()
    return codes

codes = asyncio.run(main(sys.argv[1]))
print(json.dumps({"codes": codes, "modules": sorted(set(sys.modules) - before)}))
"""


def base_closure(name: str) -> set[str]:
    """``name`` and every distribution its requirements bring, without extras, transitively (as installed)."""
    seen = {canonicalize_name(name)}
    todo = [name]
    while todo:
        for text in metadata.requires(todo.pop()) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({**default_environment(), "extra": ""}):
                continue
            dist = canonicalize_name(req.name)
            if dist not in seen:
                seen.add(dist)
                todo.append(req.name)
    return seen


def test_every_module_the_web_view_imports_comes_with_the_base_dependencies(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SERVE, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert set(seen["codes"].values()) <= {200, 303}, seen["codes"]
    assert seen["codes"]["POST /action/signal"] == 303, "the signal button's form was not parsed"
    owners = metadata.packages_distributions()
    used = {canonicalize_name(dist) for module in seen["modules"] for dist in owners.get(module.split(".")[0], [])}
    missing = sorted(used - base_closure("durable-sandbox") - set(OPTIONAL))
    assert not missing, f"the web view imports modules of {missing}, which no base dependency brings: declare them"
