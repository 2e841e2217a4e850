"""`dsb store grant-namespace NS --role R`: a namespace's own database role for the operator's PostgreSQL journal
(stores/postgres_grants.py), so that the namespace's workers read and write its runs and no other namespace's."""

from __future__ import annotations

import click

from durable_sandbox.cli.commands.common import pass_settings, run_async
from durable_sandbox.runs.settings import Settings

__all__ = ["store"]


@click.group()
def store() -> None:
    """The store itself (the operator's PostgreSQL journal)."""


@store.command("grant-namespace")
@click.argument("target_namespace", metavar="NAMESPACE")
@click.option("--role", required=True, metavar="ROLE",
              help="The namespace's database role (created NOLOGIN if missing; GRANT it to the workers' login).")
@pass_settings
def grant_namespace_cmd(settings: Settings, target_namespace: str, role: str) -> None:
    """Give ROLE the rights a worker of NAMESPACE needs on the operator's PostgreSQL journal (--store or $DSB_STORE:
    the DSN the operator journals to, with a role that owns its schemas): its namespace's schema and nothing else.

    Then let the workers' login use it (`GRANT ROLE TO worker_login`) and give the workers that login's DSN with
    ?schema=<the namespace's schema>, which this prints."""
    from durable_sandbox.kube.store.journals import namespace_schema
    from durable_sandbox.stores.postgres import PostgresStore, split_dsn
    from durable_sandbox.stores.postgres_grants import GrantRefused, check_role_name, grant_namespace
    from durable_sandbox.stores.urls import is_postgres_url

    dsn = settings.location
    if not is_postgres_url(dsn):
        raise click.UsageError("grant-namespace works on a PostgreSQL journal: give its DSN with --store "
                               "postgresql://owner@host/db[?schema=base] (or $DSB_STORE)")
    try:
        check_role_name(role)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--role") from None
    namespace = target_namespace
    real, base = split_dsn(dsn)
    schema = namespace_schema(base, namespace)

    async def go() -> list[str]:
        opened = await PostgresStore.connect(f"{real}?schema={schema}", pool_size=1)  # creates or migrates it
        try:
            async with opened.pool.acquire() as conn:
                return await grant_namespace(conn, schema, role)
        finally:
            await opened.close()

    try:
        others = run_async(go())
    except GrantRefused as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"role {role} may read and write the runs of namespace {namespace} (schema {schema}) and no other "
               f"namespace's; let the workers' login use it: GRANT {role} TO <login>")
    if others:
        click.echo(f"warning: role {role} may also use schema(s) {', '.join(others)}: a role shared by namespaces "
                   f"confines none of them; give each namespace a role of its own", err=True)
