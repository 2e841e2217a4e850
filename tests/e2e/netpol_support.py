"""A NetworkPolicy enforcer beside the test node, for the tests that prove what a NetworkPolicy does.

The node's CNI (the bridge plugin) enforces no NetworkPolicy, so the tests that need one take the
``network_policy_enforcer`` fixture: kube-router's firewall controller (scripts/netpol-build builds it; routing and
service proxy off) runs as a host process with the node's kubeconfig for the module, and is stopped, its iptables
chains and ipsets removed, after it; the node's other tests never start it. kube-router enforces in the host's
filter table (INPUT, FORWARD, OUTPUT; bridged traffic through br_netfilter), so a Pod's traffic to another Pod and
to the host's own addresses (the API server's 10.0.0.1, the node's 10.88.0.1) both meet the policy.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.processes import stop_process

from .controlplane import PROJECT_ROOT, wait_until
from .node_support import NodeCluster, _script_output

NETPOL_SCRIPT = PROJECT_ROOT / "scripts" / "netpol-build"
# The node has no kube-proxy: the `kubernetes` Service's 10.0.0.1 is a host address that socat serves. kube-router
# lets every Pod reach its service range unchecked (it expects kube-proxy to have translated such addresses
# before the filter table), so it is told an unused range instead and applies the policies to 10.0.0.1 too.
UNUSED_SERVICE_RANGE = "10.0.255.0/24"
READY_TIMEOUT_S = 60.0


def enforcer_binary() -> Path:
    """scripts/netpol-build's kube-router, once per session (the e2e conftest builds it outside any test)."""
    return _script_output(NETPOL_SCRIPT)


def _iptables_save() -> str:
    # Never `iptables-save -t filter`: with the nft backend naming a table creates it.
    return subprocess.run(["iptables-save"], capture_output=True, text=True, check=False).stdout


def _ipsets() -> set[str]:
    return set(subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, check=False).stdout.split())


def _netfilter_state() -> str:
    """The host's iptables rules (counters and comments left out) and ipset names: what the enforcer changes."""
    kept = [line.split(" [")[0] for line in _iptables_save().splitlines() if not line.startswith("#")]
    return "\n".join(kept) + "\n-- ipsets:\n" + "\n".join(sorted(_ipsets()))


def _filter_table() -> str | None:
    """The filter table as iptables-restore reads it (None when the host has none yet)."""
    dump = _iptables_save()
    if "*filter\n" not in dump:
        return None
    section = dump[dump.index("*filter\n"):]
    return section[:section.index("COMMIT\n") + len("COMMIT\n")]


def _restore(filter_table: str | None, ipsets: set[str]) -> None:
    """Put back the filter table and ipsets as they were before kube-router ran. (Its own ``--cleanup-config`` also
    resets the routing and service proxy controllers' state, links, routes and IPVS, which it never made here.)"""
    if filter_table is None:  # iptables cannot drop a table it made; nft can
        subprocess.run(["nft", "delete", "table", "ip", "filter"], capture_output=True, check=False)
    else:
        subprocess.run(["iptables-restore"], input=filter_table, capture_output=True, text=True, check=False)
    for name in sorted(_ipsets() - ipsets):
        subprocess.run(["ipset", "destroy", name], capture_output=True, check=False)


def _has_chains() -> bool:
    rules = _iptables_save()
    return all(f":{chain} " in rules for chain in ("KUBE-ROUTER-INPUT", "KUBE-ROUTER-FORWARD", "KUBE-ROUTER-OUTPUT"))


@dataclass
class Enforcer:
    """kube-router enforcing NetworkPolicy on the node; ``log`` is its output."""

    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:]) if self.log.exists() else ""


@contextlib.contextmanager
def run_enforcer(cluster: NodeCluster, workdir: Path) -> Iterator[Enforcer]:
    """kube-router against ``cluster``'s node until the block ends; then its rules are removed, and the host's
    iptables rules and ipsets must be what they were before it started."""
    binary = enforcer_binary()
    before, filter_table, ipsets = _netfilter_state(), _filter_table(), _ipsets()
    log = workdir / "kube-router.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(binary), f"--kubeconfig={cluster.kubeconfig}", f"--hostname-override={cluster.node}",
             "--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--enable-cni=false",
             f"--service-cluster-ip-range={UNUSED_SERVICE_RANGE}", "--health-port=0", "--iptables-sync-period=10s",
             "-v=1"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    enforcer = Enforcer(process, log)
    try:
        wait_until(lambda: _has_chains() or not enforcer.alive(), READY_TIMEOUT_S, "kube-router's chains")
        if not enforcer.alive():
            raise RuntimeError(f"kube-router exited {process.returncode}:\n{enforcer.tail()}")
        yield enforcer
    finally:
        stop_process(process, timeout=30)
        _restore(filter_table, ipsets)
        after = _netfilter_state()
        if after != before:
            raise AssertionError(f"kube-router's netfilter state could not be removed:\nbefore:\n{before}\n"
                                 f"after:\n{after}")
