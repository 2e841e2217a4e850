"""`dsb operator`: the Kubernetes operator (kopf) serving Workflow resources."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from durable_sandbox.runs.errors import EXIT_FAILED, CliError
from durable_sandbox.sandboxes.retries import CLEANUP_ATTEMPTS

if TYPE_CHECKING:
    from durable_sandbox.kube.process.process_config import PoolProviderFactory, ProviderFactory, Service
    from durable_sandbox.kube.reporting.oplog import LogFormat
    from durable_sandbox.kube.store.journals import JournalChoice
    from durable_sandbox.kube.telemetry.metrics import OperatorMetrics
    from durable_sandbox.providers.contract import SandboxProvider


def _modules(value: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in value.split(",") if m.strip())


@click.command("operator")
@click.option("--allow-local-provider", is_flag=True,
              help="Allow Workflows to use the local provider (development only: it is no isolation boundary).")
@click.option("--default-provider", metavar="NAME", default="local", show_default=True,
              envvar="DSB_DEFAULT_PROVIDER", show_envvar=True,
              help="The sandbox provider of a Workflow or Sandbox that names none (pinned when the operator first "
                   "takes it up: a later change moves nothing that runs). local suits an operator started by hand "
                   "for development (with --allow-local-provider); the chart passes kubernetes.")
@click.option("--workflows", "workflow_modules", metavar="MODULES", default="",
              help="Comma-separated modules or packages Workflow entrypoints may be imported from "
                   "(e.g. pkg.flows,other.pkg); the built-in sandbox-agent (toolCalls) is always allowed.")
@click.option("-n", "--namespace", "namespaces", multiple=True,
              help="Serve only this namespace (repeatable) [default: every namespace].")
@click.option("--lease-seconds", default=15.0, show_default=True, type=click.FloatRange(2.0, 600.0),
              help="Run lease TTL: how long a dead replica's runs wait before another replica takes them over.")
@click.option("--hibernate-after", default=300.0, show_default=True, type=click.FloatRange(0.0),
              help="Seconds a waiting run keeps its sandbox before it is snapshotted and destroyed "
                   "(spec.hibernateAfterSeconds overrides it per Workflow).")
@click.option("--max-concurrent-runs", default=50, show_default=True, type=click.IntRange(1),
              help="Runs this replica executes at once; more wait in phase Pending (Ready=False, reason "
                   "ConcurrencyLimit) until a slot frees, and another replica with room may take them.")
@click.option("--installation-id", default=None, metavar="ID",
              help="Label of every sandbox and snapshot this operator makes; the orphan sweep removes only what "
                   "carries it. Unique per operator deployment [default: namespaces:<the -n namespaces>, else "
                   "<$POD_NAMESPACE>/durable-sandbox or durable-sandbox; the chart passes <release namespace>/<release name>].")
@click.option("--sweep-interval", default=300.0, show_default=True, type=click.FloatRange(0.0),
              help="Seconds between orphan sweeps (sandboxes and snapshots of this installation that no live "
                   "Workflow or Sandbox claims); 0 turns the sweep off.")
@click.option("--sweep-grace", default=600.0, show_default=True, type=click.FloatRange(0.0),
              help="An orphan is removed only once seen orphaned for this many seconds (longer than a "
                   "provision takes to be journaled).")
@click.option("--cleanup-attempts", default=CLEANUP_ATTEMPTS, show_default=True, type=click.IntRange(1, 100),
              envvar="DSB_CLEANUP_ATTEMPTS", show_envvar=True,
              help="How many times a run's cleanup tries a provider's sandbox destroy or snapshot deletion (with "
                   "backoff, 0.2 s doubling to 5 s) before it fails; a deleted Workflow's finalizer then says "
                   "CleanupBlocked and tries again later.")
@click.option("--worker-id", default=None,
              help="This replica's name in run leases; a per-start nonce is appended, so two processes started with "
                   "the same name never both hold a lease [default: host:pid:start:random].")
@click.option("--journal-key-secret", metavar="[NAMESPACE/]NAME", default=None,
              help="Secret holding the key that seals the operator's journal values (created with a random key if "
                   "missing); never in a namespace the operator serves, nor readable by a RoleBinding of its "
                   "namespace [default: the operator's own namespace ($POD_NAMESPACE, else its ServiceAccount's, else "
                   "the kubeconfig context's)/durable-sandbox-journal-key].")
@click.option("--journal", "journal_dsn", metavar="apiserver|postgresql://...", default="apiserver", show_default=True,
              envvar="DSB_OPERATOR_JOURNAL", show_envvar=True,
              help="Where runs' journals, events and signals go: the API server (Journal objects), or PostgreSQL "
                   "(postgresql://user:password@host/db[?schema=base]; one schema per namespace). Give a DSN "
                   "with a password through the environment variable (the chart sets it from a Secret), never "
                   "on the command line, where every process listing shows it.")
@click.option("--liveness", metavar="URL", default=None,
              help="Serve a liveness probe, e.g. http://0.0.0.0:8080/healthz.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics (/metrics), liveness (/healthz) and readiness (/readyz) on this port "
                   "(docs/operations.md) [default: not served].")
@click.option("--metrics-host", default="0.0.0.0", show_default=True, help="Address for --metrics-port.")
@click.option("--session-port", type=click.IntRange(0, 65535), default=None,
              help="Serve the Sandboxes' call API (docs/agents.md) on this port: agents call a Sandbox one call at a "
                   "time, journaled, with their own Kubernetes token.")
@click.option("--session-host", default="0.0.0.0", show_default=True, help="Address for --session-port.")
@click.option("--session-tls-cert", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Serve the call API over HTTPS with this certificate (PEM); with --session-tls-key.")
@click.option("--session-tls-key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The private key (PEM) of --session-tls-cert.")
@click.option("--session-max-concurrent-calls", type=click.IntRange(1), default=4, show_default=True,
              help="Calls of one Sandbox in flight or waiting their turn in this replica; more are refused (429).")
@click.option("--session-max-request-bytes", type=click.IntRange(1024), default=1 << 20, show_default=True,
              help="The largest call request body (write_file contents included); larger is refused (413).")
@click.option("--session-max-calls-per-second", type=click.FloatRange(0, min_open=True), default=20.0,
              show_default=True, help="Calls per second one caller (Kubernetes user) may make in this replica; more "
                                      "are refused (429 with Retry-After).")
@click.option("--session-hold-seconds", type=click.FloatRange(0), default=5.0, show_default=True,
              help="How long a Sandbox's session keeps its holder and journal lease after a call, for the next one "
                   "(0: let go after every call); a Workflow with spec.sandboxRef waits that long at most.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              envvar="DSB_LOG_FORMAT", show_envvar=True,
              help="text: one line per record; json: one JSON object per line (time, level, logger, message, and "
                   "namespace, workflow, run where known), for log pipelines (docs/operations.md).")
@click.option("-v", "--verbose", is_flag=True, help="Log kopf's own activity too.")
def operator(
    allow_local_provider: bool,
    default_provider: str,
    workflow_modules: str,
    namespaces: tuple[str, ...],
    lease_seconds: float,
    hibernate_after: float,
    max_concurrent_runs: int,
    installation_id: str | None,
    sweep_interval: float,
    sweep_grace: float,
    cleanup_attempts: int,
    worker_id: str | None,
    journal_key_secret: str | None,
    journal_dsn: str,
    liveness: str | None,
    metrics_port: int | None,
    metrics_host: str,
    session_port: int | None,
    session_host: str,
    session_tls_cert: str | None,
    session_tls_key: str | None,
    session_max_concurrent_calls: int,
    session_max_request_bytes: int,
    session_max_calls_per_second: float,
    session_hold_seconds: float,
    log_format: LogFormat,
    verbose: bool,
) -> None:
    """Run the operator: reconcile Workflow resources of the cluster in $KUBECONFIG (or in-cluster).

    Run several replicas at once: each run is executed by one replica at a time under a Lease, and a
    stopping replica (SIGTERM) hands its runs to the others at a call boundary.
    """
    try:
        from durable_sandbox.kube import handlers
        from durable_sandbox.kube.api.apiserver_away import ApiServerAway
        from durable_sandbox.kube.process.application import OperatorApplication
        from durable_sandbox.kube.process.process_config import OperatorConfig
        from durable_sandbox.kube.reporting.oplog import configure as configure_logging
        from durable_sandbox.kube.sweep.sweeper import default_installation_id
        from durable_sandbox.kube.workflow.controller import OperatorPolicy, OperatorSettings
        from durable_sandbox.providers.kubernetes_egress import ENV_EGRESS_POLICY
    except ImportError as exc:
        raise CliError(f"dsb operator needs the Kubernetes extra: pip install 'durable-sandbox[kubernetes]' ({exc})") from exc
    away = ApiServerAway()  # the application's: kopf's retries of an API server away are said through it too
    configure_logging(log_format, verbose=verbose, away=away)
    policy = OperatorPolicy(
        allow_local_provider=allow_local_provider, workflow_modules=_modules(workflow_modules),
        default_provider=_default_provider(default_provider, allow_local_provider),
    )
    settings = OperatorSettings(lease_ttl=lease_seconds, hibernate_after=hibernate_after,
                                max_concurrent_runs=max_concurrent_runs,
                                installation_id=installation_id or default_installation_id(namespaces),
                                sweep_interval=sweep_interval, sweep_grace=sweep_grace,
                                cleanup_attempts=cleanup_attempts)
    if worker_id:
        settings = replace(settings, worker_id=f"{worker_id}:{uuid.uuid4().hex[:8]}")
    key = _journal_key(journal_key_secret, namespaces)
    services = () if session_port is None else (_session_api(
        namespaces, port=session_port, host=session_host, cert=session_tls_cert, key=session_tls_key,
        concurrent=session_max_concurrent_calls, request_bytes=session_max_request_bytes, hold=session_hold_seconds,
        per_second=session_max_calls_per_second),)
    config = OperatorConfig(
        policy=policy, settings=settings, namespaces=tuple(namespaces), journal_key=key,
        journal=_journal_choice(journal_dsn), providers=_provider_factory(key), pool_provider=_pool_provider(key),
        metrics_port=metrics_port, metrics_host=metrics_host, services=services,
        egress_policy=os.environ.get(ENV_EGRESS_POLICY, ""),
    )
    problem = handlers.run(OperatorApplication(config, away=away), liveness=liveness)
    if problem is not None:
        raise CliError(problem, code=EXIT_FAILED)


def _provider_factory(key: bytes | None) -> ProviderFactory:
    """Every provider the operator uses, counted in its metrics (tool calls, latency, snapshots, losses, cleanup
    failures); the kubernetes provider also gets the pool key (warm Pods are trusted only with the operator's seal)."""
    from durable_sandbox.providers.registry import create_provider

    def make(name: str, metrics: OperatorMetrics) -> SandboxProvider:
        return metrics.instrument(create_provider(name, **_provider_options(name, key, metrics)))

    return make


def _session_api(namespaces: tuple[str, ...], *, port: int, host: str, cert: str | None, key: str | None,
                 concurrent: int, request_bytes: int, hold: float, per_second: float) -> Service:
    """The Sandboxes' call API (sessions/), served by the operator process beside its controllers."""
    if (cert is None) != (key is None):
        raise CliError("--session-tls-cert and --session-tls-key go together: give both (HTTPS) or neither (HTTP)")
    from durable_sandbox.sessions.hold import HoldSettings
    from durable_sandbox.sessions.models import Limits
    from durable_sandbox.sessions.startup import SessionApiService, SessionApiSettings

    return SessionApiService(SessionApiSettings(
        port=port, host=host, certfile=cert, keyfile=key, hold=HoldSettings(idle_seconds=hold),
        limits=Limits(max_concurrent_calls=concurrent, max_request_bytes=request_bytes,
                      max_calls_per_second=per_second)), tuple(namespaces))


KEY_WAIT_S = 120.0  # how long a starting operator waits for an API server that does not answer (a restart)


def _read_key(fetch: Callable[[], Coroutine[Any, Any, bytes]], readers: Callable[[], Coroutine[Any, Any, Any]],
              where: str) -> tuple[bytes, Any]:
    """The journal key and who else may read it, waiting (with a backoff, up to KEY_WAIT_S) while the API server
    does not answer: an operator started while its API server restarts (a Pod rescheduled beside a control-plane
    upgrade) would otherwise exit 1 and be restarted for nothing (the soak's 'exited without being killed')."""
    from durable_sandbox.kube.api.api_errors import brief, is_transient

    deadline, delay, said = time.monotonic() + KEY_WAIT_S, 0.5, False
    while True:
        try:
            return asyncio.run(fetch()), asyncio.run(readers())
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            if not said:
                logging.getLogger("durable_sandbox.kube").warning(
                    "the API server does not answer reading the journal key %s (%s); waiting up to %.0fs for it",
                    where, brief(exc), KEY_WAIT_S)
                said = True
            time.sleep(delay)  # a backoff between tries, not a synchronization
            delay = min(delay * 2, 5.0)


def _journal_key(location: str | None, served: tuple[str, ...]) -> bytes:
    """The journal key (kube/journal/journal_key.py), refused when others can read it where that can be told
    (kube/journal/journal_key_readers.py)."""
    from durable_sandbox.kube.journal import journal_key
    from durable_sandbox.kube.journal.journal_key_readers import (
        readers_of,
        readers_problem,
        served_namespace_problem,
    )
    from durable_sandbox.runs.cluster import default_namespace

    try:
        namespace, name = (journal_key.parse_location(location, default_namespace) if location
                           else journal_key.default_location(default_namespace))
        problem = served_namespace_problem(namespace, name, served)
        if problem is not None:
            raise CliError(problem, code=EXIT_FAILED)
        key, readers = _read_key(lambda: journal_key.fetch(namespace, name), lambda: readers_of(namespace, name),
                                 f"{namespace}/{name}")
    except (journal_key.JournalKeyError, RuntimeError) as exc:
        raise CliError(str(exc), code=EXIT_FAILED) from None
    except CliError:
        raise
    except Exception as exc:
        raise CliError(f"Cannot read the journal key Secret: {type(exc).__name__}: {exc}", code=EXIT_FAILED) from None
    if readers is None:
        logging.getLogger("durable_sandbox.kube").info(
            "journal key %s/%s: who else may read it was not checked (this operator may not list RoleBindings or "
            "create SubjectAccessReviews there; docs/operations.md)", namespace, name)
    elif readers:
        raise CliError(readers_problem(namespace, name, readers), code=EXIT_FAILED)
    return key


def _provider_options(name: str, key: bytes | None, metrics: OperatorMetrics) -> dict[str, Any]:
    """What the operator gives a provider beyond its environment: the kubernetes provider's pool key (derived from
    the journal key, so every replica has the same) and the metrics of its claims; the agent-sandbox provider's key
    of its claims' seals (the same derivation)."""
    from durable_sandbox.providers.kubernetes_pool import derive_pool_key

    if key is None or name not in ("kubernetes", "agent-sandbox"):
        return {}
    if name == "agent-sandbox":  # its claims' seals (providers/agent_sandbox_claims.py): one key for every replica
        return {"pool_key": derive_pool_key(key)}
    return {"pool_key": derive_pool_key(key), "pool_observer": metrics.observe_pool_claim}


def _pool_provider(key: bytes | None) -> PoolProviderFactory | None:
    """What makes the SandboxPools' provider, or None when the kubernetes provider cannot be used here (each pool
    then says so)."""
    import os

    from durable_sandbox.providers.registry import available_providers, create_provider

    cls = available_providers().get("kubernetes")
    if cls is None or cls.configuration_problems(os.environ):
        return None
    return lambda metrics: create_provider("kubernetes", **_provider_options("kubernetes", key, metrics))


def _default_provider(name: str, allow_local: bool) -> str:
    """``--default-provider``: an installed provider (else the operator does not start). One it cannot use here
    (local without --allow-local-provider, a provider missing its configuration) is said now, and each Workflow
    or Sandbox that names no provider is refused saying so (kube/spec/provider_choice.py)."""
    import os

    from durable_sandbox.kube.spec.provider_choice import LOCAL
    from durable_sandbox.providers.registry import available_providers

    name = name.strip()
    installed = available_providers()
    if name not in installed:
        raise CliError(f"--default-provider {name!r}: no such provider is installed (available: "
                       f"{', '.join(sorted(installed))})", code=EXIT_FAILED)
    log = logging.getLogger(__name__)
    if name == LOCAL and not allow_local:
        log.warning("--default-provider is local, which this operator does not allow (no --allow-local-provider): "
                    "Workflows and Sandboxes that name no provider are refused")
    elif problems := installed[name].configuration_problems(os.environ):
        log.warning("--default-provider %s is not available here (%s): Workflows and Sandboxes that name no provider "
                    "are refused", name, "; ".join(problems))
    return name


def _journal_choice(value: str) -> JournalChoice:
    """The journal ``--journal`` names, its PostgreSQL server reached once here so that a wrong DSN or a server
    out of reach is said at start (redacted), not retried by kopf's startup handler forever."""
    from durable_sandbox.engine.errors import StoreError
    from durable_sandbox.kube.store.journals import ApiServerJournal, PostgresJournal, probe
    from durable_sandbox.providers.redaction import redact_url
    from durable_sandbox.stores.urls import is_postgres_url

    if value.strip().lower() in ("", "apiserver"):
        return ApiServerJournal()
    if not is_postgres_url(value):
        raise CliError(f"--journal {redact_url(value)}: give apiserver or a postgresql:// URL", code=EXIT_FAILED)
    choice = PostgresJournal(value.strip())
    try:
        asyncio.run(probe(choice))
    except StoreError as exc:
        raise CliError(f"--journal: {exc}", code=EXIT_FAILED) from None
    return choice
