"""A private PostgreSQL server for the tests, the benchmarks and `scripts/dev-postgres`: Debian's packages,
installed when missing, and a server of our own on loopback with its own data directory.

Layout of a server directory ``D`` (made traversable, ``0711``, so the server user can reach its part):

- ``D/data``: the cluster (``initdb``), owned by the server user, ``0700``; its unix socket is in it too
- ``D/postgres.log``: the server's log
- ``D/server.json``: port, server user, binaries and the superuser's password (``0600``, the caller's)

Why a server user: the tests run as root and ``postgres`` refuses to run as root. As root the server runs as
the ``postgres`` system user (Debian's packages create it), else as ``dsb-postgres``, created here; as anyone
else it runs as that user. Nothing is cached: ``initdb`` takes a second or two, and a fresh cluster per
session means no state leaks from one session into the next.

Standard library only: ``scripts/dev-postgres`` runs it with any Python 3.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port

INSTALL_LOCK = Path(tempfile.gettempdir()) / "durable-sandbox-postgres-install.lock"
# Debian's packages would create and start a cluster of their own ("main" on port 5432); we never use it.
CREATECLUSTER_DROPIN = Path("/etc/postgresql-common/createcluster.d/50-durable-sandbox.conf")
SERVER_USER = "postgres"
FALLBACK_USER = "dsb-postgres"
SUPERUSER = "postgres"
START_TIMEOUT_S = 120

# Settings for a test server: loopback only, the socket in the data directory. fsync is off (an OS crash
# is no test's concern, and it makes CREATE SCHEMA and commits cheap); synchronous_commit stays on, so a
# commit the server acknowledged survives the server's own crash (`restart(mode="immediate")`).
TEST_SETTINGS = {
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "log_min_messages": "warning",
    "log_connections": "off",
}
# `--durable` (the benchmarks): PostgreSQL's defaults, every commit flushed to disk as in production.
DURABLE_SETTINGS = {"max_connections": "200", "log_min_messages": "warning"}


class PostgresUnavailable(RuntimeError):
    """The server binaries cannot be found or installed, or the server does not start: says why."""


def find_bin_dir() -> Path | None:
    """The directory of ``postgres``/``initdb``/``pg_ctl``: $DSB_POSTGRES_BIN, Debian's newest
    /usr/lib/postgresql/<major>/bin, or where ``pg_ctl`` on PATH really is."""
    given = os.environ.get("DSB_POSTGRES_BIN")
    candidates = [Path(given)] if given else []
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        majors = sorted((p for p in debian.iterdir() if p.name.isdigit()), key=lambda p: int(p.name), reverse=True)
        candidates += [p / "bin" for p in majors]
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for directory in candidates:
        if all((directory / tool).is_file() for tool in ("postgres", "initdb", "pg_ctl")):
            return directory
    return None


def install() -> Path:
    """The server binaries' directory, installing Debian's ``postgresql`` first when they are missing."""
    found = find_bin_dir()
    if found is not None:
        return found
    if os.geteuid() != 0:
        raise PostgresUnavailable(
            "the PostgreSQL server is not installed (no initdb/pg_ctl/postgres); install it "
            "(`sudo apt-get install postgresql`) or set DSB_POSTGRES_BIN to its bin directory"
        )
    if shutil.which("apt-get") is None:
        raise PostgresUnavailable("the PostgreSQL server is not installed and this machine has no apt-get; "
                                  "install PostgreSQL and set DSB_POSTGRES_BIN to its bin directory")
    with _locked(INSTALL_LOCK):
        found = find_bin_dir()  # another session installed it while we waited
        if found is not None:
            return found
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        apt = ["apt-get", "-q", "-y", "-o", "DPkg::Lock::Timeout=600", "--no-install-recommends"]
        _apt([*apt[:2], "-o", "DPkg::Lock::Timeout=600", "update"], env)
        _apt([*apt, "install", "postgresql-common"], env)
        CREATECLUSTER_DROPIN.parent.mkdir(parents=True, exist_ok=True)
        CREATECLUSTER_DROPIN.write_text("# durable-sandbox's tests run servers of their own\ncreate_main_cluster = false\n")
        _apt([*apt, "install", "postgresql"], env)
    found = find_bin_dir()
    if found is None:
        raise PostgresUnavailable("apt-get installed postgresql, yet no initdb/pg_ctl/postgres was found under "
                                  "/usr/lib/postgresql/*/bin")
    return found


def _apt(argv: list[str], env: dict[str, str]) -> None:
    print(f"dev-postgres: {' '.join(argv)}", file=sys.stderr)
    proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if proc.returncode != 0:
        raise PostgresUnavailable(f"`{' '.join(argv)}` failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _server_account() -> pwd.struct_passwd:
    """Who the server runs as: this user, or (as root) ``postgres``, else ``dsb-postgres`` (created)."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    for name in (SERVER_USER, FALLBACK_USER):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", FALLBACK_USER],
                   check=True, capture_output=True)
    return pwd.getpwnam(FALLBACK_USER)


def _check_reachable(directory: Path, account: pwd.struct_passwd) -> None:
    """The server user must be able to enter every directory above its own: say which one it cannot."""
    if account.pw_uid == os.geteuid():
        return
    for parent in directory.resolve().parents:
        info = parent.stat()
        if info.st_uid != account.pw_uid and not info.st_mode & 0o001:
            raise PostgresUnavailable(
                f"the server runs as {account.pw_name}, who cannot enter {parent} (mode {info.st_mode & 0o777:o}); "
                f"choose a directory outside it, or `chmod o+x {parent}`"
            )


@dataclass
class PostgresServer:
    """One server directory (see the module's docstring). ``up()`` makes and starts it; ``down()`` stops it."""

    directory: Path
    durable: bool = False

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "postgres.log"

    @property
    def state_file(self) -> Path:
        return self.directory / "server.json"

    def state(self) -> dict[str, object]:
        loaded: dict[str, object] = json.loads(self.state_file.read_text())
        return loaded

    @property
    def port(self) -> int:
        return int(str(self.state()["port"]))

    @property
    def password(self) -> str:
        return str(self.state()["password"])

    def dsn(self, database: str = "postgres", *, password: bool = True) -> str:
        secret = f":{self.password}" if password else ""
        return f"postgresql://{SUPERUSER}{secret}@127.0.0.1:{self.port}/{database}"

    # ------------------------------------------------------------------ lifecycle

    def up(self) -> PostgresServer:
        """Install if needed, initdb if the directory has no cluster, start if not running."""
        bin_dir = install()
        if not (self.data / "PG_VERSION").is_file():
            self._init(bin_dir)
        if not self.running():
            self.start()
        return self

    def _init(self, bin_dir: Path) -> None:
        account = _server_account()
        self.directory.mkdir(parents=True, exist_ok=True)
        _check_reachable(self.directory, account)
        os.chmod(self.directory, 0o711)
        self.data.mkdir(mode=0o700, exist_ok=True)
        os.chown(self.data, account.pw_uid, account.pw_gid)
        self.log.touch(mode=0o600)
        os.chown(self.log, account.pw_uid, account.pw_gid)
        password = secrets.token_urlsafe(18)
        fd, pwfile = tempfile.mkstemp(prefix="pw-", dir=self.directory)
        try:
            os.write(fd, password.encode() + b"\n")
            os.close(fd)
            os.chown(pwfile, account.pw_uid, account.pw_gid)
            self._as_server(account, [str(bin_dir / "initdb"), "-D", str(self.data), "-U", SUPERUSER,
                                      "--pwfile", pwfile, "--auth-local=trust", "--auth-host=scram-sha-256",
                                      "-E", "UTF8", "--locale=C", "--no-instructions"], "initdb")
        finally:
            os.unlink(pwfile)
        settings = {**(DURABLE_SETTINGS if self.durable else TEST_SETTINGS), "listen_addresses": "'127.0.0.1'",
                    "unix_socket_directories": f"'{self.data}'"}
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# durable-sandbox test server\n")
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
        fd = os.open(self.state_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"port": 0, "user": account.pw_name, "bin": str(bin_dir), "password": password,
                       "durable": self.durable}, out)

    def _as_server(self, account: pwd.struct_passwd, argv: list[str], what: str,
                   timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        as_other = os.geteuid() != account.pw_uid
        proc = subprocess.run(
            argv, user=account.pw_uid if as_other else None, group=account.pw_gid if as_other else None,
            extra_groups=[] if as_other else None, cwd=self.directory, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C", "LC_ALL": "C"},
        )
        if proc.returncode != 0:
            raise PostgresUnavailable(f"{what} failed (exit {proc.returncode}): {proc.stdout.strip()[-2000:]}"
                                      f"\n(server log: {self.log})")
        return proc

    def _pg_ctl(self, *args: str, what: str) -> subprocess.CompletedProcess[str]:
        state = self.state()
        account = pwd.getpwnam(str(state["user"]))
        return self._as_server(account, [str(Path(str(state["bin"])) / "pg_ctl"), "-D", str(self.data), *args], what)

    def start(self) -> None:
        """Start on the recorded port, or on a free one (tried again with another if it was taken meanwhile)."""
        state = self.state()
        for attempt in range(5):
            port = int(str(state["port"])) or free_port()
            try:
                self._pg_ctl("-l", str(self.log), "-w", "-t", str(START_TIMEOUT_S), "-o", f"-p {port}", "start",
                             what=f"starting PostgreSQL on 127.0.0.1:{port}")
            except PostgresUnavailable:
                if attempt == 4 or int(str(state["port"])):
                    raise
                continue
            state["port"] = port
            self._save(state)
            return

    def _save(self, state: dict[str, object]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(state, out)
        os.replace(tmp, self.state_file)

    def stop(self, mode: str = "fast") -> None:
        """``mode``: ``fast`` (connections are cut, a clean shutdown) or ``immediate`` (as a crash: the next
        start replays the WAL)."""
        if self.running():
            self._pg_ctl("-m", mode, "-w", "-t", str(START_TIMEOUT_S), "stop", what="stopping PostgreSQL")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def running(self) -> bool:
        pid = self.pid()
        if pid is None or not self.state_file.exists():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def down(self, *, purge: bool = False) -> None:
        if self.state_file.exists():
            try:
                self.stop()
            except PostgresUnavailable:
                pid = self.pid()
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        if purge:
            shutil.rmtree(self.directory, ignore_errors=True)

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run ``statement`` with psql as the superuser over the unix socket (trusted); returns its output."""
        state = self.state()
        psql = Path(str(state["bin"])) / "psql"
        proc = subprocess.run(
            [str(psql if psql.exists() else "psql"), "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", "-h", str(self.data),
             "-p", str(self.port), "-U", SUPERUSER, "-d", database, "-c", statement],
            capture_output=True, text=True, timeout=120, check=False,
        )
        if proc.returncode != 0:
            raise PostgresUnavailable(f"psql {statement!r}: {proc.stderr.strip()}")
        return proc.stdout

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise PostgresUnavailable(f"PostgreSQL does not accept connections on port {self.port}; "
                                              f"see {self.log}") from None
                time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(prog="scripts/dev-postgres", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["install", "up", "down", "restart", "status", "dsn"])
    parser.add_argument("--dir", type=Path, default=root / ".dev-postgres", help="server directory [.dev-postgres]")
    parser.add_argument("--durable", action="store_true",
                        help="with up on a new directory: PostgreSQL's default durability (fsync on), for benchmarks")
    parser.add_argument("--purge", action="store_true", help="with down: delete the directory too")
    parser.add_argument("--mode", default="fast", choices=["fast", "immediate"], help="with restart")
    args = parser.parse_args(argv)
    server = PostgresServer(args.dir.resolve(), durable=args.durable)
    try:
        if args.command == "install":
            print(install())
        elif args.command == "up":
            server.up()
            print(f"dev-postgres: running on 127.0.0.1:{server.port} (data {server.data}, log {server.log})",
                  file=sys.stderr)
            print(f"export DSB_POSTGRES_DSN={server.dsn()}")
        elif args.command == "down":
            server.down(purge=args.purge)
            print("dev-postgres: stopped", file=sys.stderr)
        elif args.command == "restart":
            server.restart(args.mode)
        elif args.command == "status":
            if not server.running():
                print("dev-postgres: not running")
                return 1
            print(f"dev-postgres: running on 127.0.0.1:{server.port} (pid {server.pid()})")
        elif args.command == "dsn":
            print(server.dsn())
    except PostgresUnavailable as exc:
        print(f"dev-postgres: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
