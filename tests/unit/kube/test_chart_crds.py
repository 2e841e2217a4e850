"""The Helm chart ships the repository's CRDs unchanged (charts/durable-sandbox/crds/ is a copy of crds/).

In the fast tier so that whoever regenerates crds/ (`python -m durable_sandbox.kube.spec.crds --write crds/`) sees at
once that the chart's copy must follow."""

from __future__ import annotations

from tests.dsb import ROOT

CHART_CRDS = ROOT / "charts" / "durable-sandbox" / "crds"


def test_chart_crds_are_the_repository_crds() -> None:
    repo = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert repo, "crds/ has no CRDs"
    assert sorted(p.name for p in CHART_CRDS.iterdir()) == repo
    stale = [n for n in repo if (CHART_CRDS / n).read_bytes() != (ROOT / "crds" / n).read_bytes()]
    assert not stale, f"charts/durable-sandbox/crds/ differs from crds/ ({', '.join(stale)}): run python -m durable_sandbox.kube.spec.crds --write charts/durable-sandbox/crds/"
