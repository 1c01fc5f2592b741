"""A real transaction-mode pooler for the tests: Debian's PgBouncer (1.18 on Debian 12, the worst
case: no prepared-statement support in transaction mode), installed from the system package
registry when missing, started on a free local port in front of the test PostgreSQL.

PgBouncer ignores the ``options`` startup parameter (so no per-schema ``search_path``): tests
through it get a database of their own instead.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from tests.postgres import require_postgres, unavailable
from tests.system_packages import ensure_debian_package

__all__ = ["pgbouncer", "pgbouncer_database"]


def _binary() -> str | None:
    def find() -> str | None:
        return shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)

    return ensure_debian_package("pgbouncer", find)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def pgbouncer(pool_mode: str = "transaction") -> Iterator[str]:
    """PgBouncer in ``pool_mode`` for the block; yields ``postgresql://user@127.0.0.1:PORT`` (no
    database: append one)."""
    upstream = urlsplit(require_postgres())
    binary = _binary()
    if binary is None:
        unavailable("PgBouncer is not installed and could not be (apt-get install pgbouncer)")
    folder = Path(tempfile.mkdtemp(prefix="x-pgbouncer-"))
    folder.chmod(0o755)  # PgBouncer refuses to run as root: it drops to the postgres user
    port = _free_port()
    user = upstream.username or "postgres"
    (folder / "users.txt").write_text(f'"{user}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={upstream.hostname or '127.0.0.1'} port={upstream.port or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\n"
        "log_connections = 0\nlog_disconnections = 0\n"
        f"pool_mode = {pool_mode}\nmax_client_conn = 1000\ndefault_pool_size = 40\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {folder / 'pgbouncer.log'}\npidfile = {folder / 'pgbouncer.pid'}\n"
        f"admin_users = {user}\n"
    )
    for path in folder.iterdir():
        path.chmod(0o644)
    argv = [binary, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:
        argv[1:1] = ["-u", "postgres"]
        shutil.chown(folder, "postgres")
    # Its console output goes to a file: a pipe nobody reads fills up and then blocks PgBouncer.
    console = open(folder / "console.log", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen([*argv, "-q"], stdout=console, stderr=subprocess.STDOUT)
    url = f"postgresql://{user}@127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                psycopg.connect(f"{url}/{upstream.path.lstrip('/') or 'postgres'}", connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = (folder / "console.log").read_text(errors="replace")
                    log = (folder / "pgbouncer.log").read_text() if (folder / "pgbouncer.log").exists() else ""
                    unavailable(f"PgBouncer did not start: {err} {log[-2000:]}")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        console.close()
        if os.environ.get("X_KEEP_PGBOUNCER_LOG"):
            print(f"PgBouncer log kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def pgbouncer_database(bouncer: str, prefix: str = "x_bouncer") -> Iterator[tuple[str, str]]:
    """A fresh database on the test server for the block: (URL through the pooler, direct URL)."""
    admin = require_postgres()
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    parts = urlsplit(admin)
    direct = parts._replace(path=f"/{name}", query="").geturl()
    try:
        yield f"{bouncer}/{name}", direct
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
