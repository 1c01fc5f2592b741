"""The README's first command: seed the example shop on the embedded SQLite default, then drive
the real `x` CLI through a backfill with its progress bar, the ledger, the pending list and jobs."""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def x(*args: str) -> None:
    """Run `x --app shop.jobs ARGS` the way an operator would, echoing the command."""
    command = ["x", "--app", "shop.jobs", *args]
    print(f"\n$ {shlex.join(command)}", flush=True)
    subprocess.run([sys.executable, "-m", "ultimat3", *command[1:]], cwd=HERE, check=True)


def main() -> None:
    """Seed, then show the whole life of a backfill."""
    db_file = HERE / "shop.db"
    for suffix in ("", "-wal", "-shm"):
        pathlib.Path(f"{db_file}{suffix}").unlink(missing_ok=True)
    os.environ["X_DATABASE_URL"] = f"sqlite:///{db_file}"
    sys.path.insert(0, str(HERE))
    from shop.db import seed

    seed(20_000)
    print(f"seeded 20,000 customers in {db_file} (embedded SQLite, no server)")
    x("db", "migrate")
    x("db", "backfill", "--pending")
    x("db", "backfill", "shop.normalize_emails", "--dry-run")
    x("db", "backfill", "shop.normalize_emails", "--wait")
    x("db", "backfill", "shop.acme_loyalty", "--wait")
    x("db", "backfill", "--pending")
    x("jobs", "ls")


if __name__ == "__main__":
    main()
