"""A namespace's own database role for the PostgreSQL journal: what `dsb store grant-namespace` runs.

The operator's PostgreSQL journal keeps each namespace's runs in a schema of its own (``<base>_ns_<namespace>``,
kube/store/journals.py). A worker of that namespace connects with a login of its own that is a member of the
namespace's role, which holds rights on that schema's tables and on nothing else: PostgreSQL checks them against
the connection's role, so a worker cannot read, claim or commit another namespace's runs whatever it sends (no
session setting to forge, no row filter to get around: the other schemas' tables are not readable at all). The
role is created ``NOLOGIN``: who logs in as it (``GRANT <role> TO <login>``) and with what password is the
database administrator's business, and no password ever passes through here.

A superuser, or a role that owns the schema, is refused: PostgreSQL checks no privilege of either.
"""

from __future__ import annotations

import re
from typing import Any

from durable_sandbox.stores.postgres_schema import check_schema_name

__all__ = ["RUN_TABLES", "GrantRefused", "check_role_name", "grant_namespace", "grant_statements"]

RUN_TABLES = ("runs", "ops", "signals", "cache", "threads", "events")  # read and written by a worker
_ROLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class GrantRefused(Exception):
    """The role cannot be confined to one namespace's schema (say why, and what to do)."""


def check_role_name(role: str) -> str:
    if not _ROLE.fullmatch(role):
        raise ValueError(f"role name {role!r} is not a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most 63 "
                         f"characters)")
    return role


def grant_statements(schema: str, role: str) -> list[str]:
    """The statements that give ``role`` a worker's rights on ``schema`` (already migrated) and on nothing else."""
    s, r = check_schema_name(schema), check_role_name(role)
    tables = ", ".join(f"{s}.{t}" for t in RUN_TABLES)
    return [
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{r}') THEN CREATE ROLE {r} NOLOGIN; "
        f"END IF; END $$",
        f"REVOKE ALL ON SCHEMA {s} FROM PUBLIC",
        f"REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM PUBLIC",
        f"GRANT USAGE ON SCHEMA {s} TO {r}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO {r}",
        f"GRANT SELECT ON {s}.meta TO {r}",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {s} TO {r}",
    ]


async def grant_namespace(conn: Any, schema: str, role: str) -> list[str]:
    """Run :func:`grant_statements` on ``conn`` (an asyncpg connection of the schema's owner) in one transaction,
    after refusing a role PostgreSQL would not confine; returns the other schemas the role may also use (which the
    caller says: a role shared by two namespaces confines neither)."""
    check_role_name(role)
    found = await conn.fetchrow("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = $1", role)
    if found is not None and found["rolsuper"]:
        raise GrantRefused(f"role {role} is a superuser: PostgreSQL checks none of its privileges, so it cannot be "
                           f"confined to schema {schema}; give the namespace a role of its own (a new name)")
    owner = await conn.fetchval("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = $1", schema)
    if owner == role:
        raise GrantRefused(f"role {role} owns schema {schema} (the operator's role): it may do anything there; give "
                           f"the namespace's workers a role of their own")
    async with conn.transaction():
        for statement in grant_statements(schema, role):
            await conn.execute(statement)
    rows = await conn.fetch(
        "SELECT nspname FROM pg_namespace WHERE nspname <> $1 AND has_schema_privilege($2, oid, 'USAGE') "
        "AND nspname NOT IN ('public', 'information_schema') AND nspname NOT LIKE 'pg\\_%'", schema, role)
    return sorted(str(r["nspname"]) for r in rows)
