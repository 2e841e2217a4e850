"""The package's public surface: the root's names resolve lazily, a provider's contract import does not load the
engine, and code inside the package never imports from the root (issue 34 item 6)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dsb import ROOT

PACKAGE = ROOT / "operator" / "durable_sandbox"


def fresh_interpreter(code: str) -> object:
    """Run ``code`` in a new interpreter (nothing imported yet) and return the JSON it prints."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_importing_the_provider_contract_loads_no_engine_module() -> None:
    loaded = fresh_interpreter(
        "import json, sys, durable_sandbox.providers.contract\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('durable_sandbox.'))))"
    )
    assert isinstance(loaded, list) and "durable_sandbox.providers.contract" in loaded
    engine = [m for m in loaded if m == "durable_sandbox.engine" or m.startswith("durable_sandbox.engine.")]
    assert engine == [], f"importing the provider contract loaded the engine: {engine}"
    above = [m for m in loaded if m.split(".")[1] in {"sandboxes", "workflows", "stores", "sandbox_engine", "kube"}]
    assert above == [], f"importing the provider contract loaded modules above the providers: {above}"


def test_every_public_name_of_the_root_resolves_to_its_defining_module() -> None:
    found = fresh_interpreter(
        "import json, durable_sandbox as ds\n"
        "print(json.dumps({n: [getattr(ds, n).__module__, n in dir(ds)] for n in ds.__all__}))"
    )
    import durable_sandbox
    from durable_sandbox.engine import Engine as BareEngine
    from durable_sandbox.sandbox_engine import Engine

    assert isinstance(found, dict) and sorted(found) == sorted(durable_sandbox.__all__)
    assert {"workflow", "Context", "Engine", "RetryPolicy", "RunStatus"} <= set(found)
    for name, (module, listed) in found.items():
        assert module.startswith("durable_sandbox."), (name, module)
        assert listed, f"{name} is in __all__ but not in dir(durable_sandbox)"
    assert durable_sandbox.Engine is Engine and issubclass(Engine, BareEngine)


def test_an_unknown_root_name_says_which_names_exist() -> None:
    import durable_sandbox

    try:
        durable_sandbox.Engien  # type: ignore[attr-defined]  # noqa: B018 - the lookup is the test
    except AttributeError as exc:
        assert "Engien" in str(exc) and "Engine" in str(exc)
    else:
        raise AssertionError("durable_sandbox.Engien resolved")


def root_imports(tree: ast.Module) -> list[int]:
    """Lines that import the root package itself (``import durable_sandbox``, ``from durable_sandbox import x``)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(alias.name == "durable_sandbox" for alias in node.names):
            lines.append(node.lineno)
        if isinstance(node, ast.ImportFrom) and node.module == "durable_sandbox" and node.level == 0:
            lines.append(node.lineno)
    return lines


def test_no_module_inside_the_package_imports_the_root() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "__init__.py":
            continue
        for line in root_imports(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert offenders == [], (
        f"these import the root package durable_sandbox (import each name from its defining module instead, "
        f"e.g. durable_sandbox.sandbox_engine.Engine): {offenders}"
    )


def test_the_rule_sees_both_spellings_of_a_root_import() -> None:
    tree = ast.parse("import durable_sandbox\nfrom durable_sandbox import Engine\nfrom durable_sandbox.engine import x\n")
    assert root_imports(tree) == [1, 2]


def test_the_kits_resolve_from_durable_sandbox_testing_and_the_old_paths_still_work() -> None:
    import durable_sandbox.testing as kits
    from durable_sandbox.providers.testing import ContractResources, ProviderContractSuite
    from durable_sandbox.stores.testing import DamagedRowCases, StoreContractSuite
    from durable_sandbox.testing.clock import FakeClock, SteppedClock

    assert sorted(kits.__all__) == sorted(["ContractResources", "DamagedRowCases", "FakeClock",
                                           "ProviderContractSuite", "SteppedClock", "StoreContractSuite"])
    assert kits.StoreContractSuite is StoreContractSuite and kits.DamagedRowCases is DamagedRowCases
    assert kits.ProviderContractSuite is ProviderContractSuite and kits.ContractResources is ContractResources
    assert kits.FakeClock is FakeClock and kits.SteppedClock is SteppedClock
    assert set(kits.__all__) <= set(dir(kits))


def test_the_provider_kit_loads_no_engine_module() -> None:
    loaded = fresh_interpreter(
        "import json, sys\nfrom durable_sandbox.testing import ProviderContractSuite\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('durable_sandbox.'))))"
    )
    assert isinstance(loaded, list) and "durable_sandbox.providers.testing" in loaded
    assert [m for m in loaded if m.startswith(("durable_sandbox.engine", "durable_sandbox.stores"))] == []


async def test_the_fake_clock_expires_a_sqlite_lease_without_waiting(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from durable_sandbox.engine import LeaseHeld, RunRecord
    from durable_sandbox.stores import SqliteStore
    from durable_sandbox.testing import FakeClock

    clock = FakeClock().install(monkeypatch)
    store = SqliteStore(tmp_path / "runs.db")
    try:
        await store.create_run(RunRecord(run_id="clocked", workflow="kit.flow"))
        await store.claim("clocked", "first", ttl=60.0)
        with pytest.raises(LeaseHeld):
            await store.claim("clocked", "second", ttl=60.0)
        clock.advance(61.0)  # the lease's minute passes on the store's clock, not the test's
        lease = await store.claim("clocked", "second", ttl=60.0)
        assert lease.owner == "second"
    finally:
        await store.close()
