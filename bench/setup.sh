#!/usr/bin/env bash
# Build the benchmark's own virtualenv, bench/.venv, with ultimat3 (editable) and the peers.
#
# The peers (procrastinate, pgqueuer) and the profilers are benchmark-only: they are never runtime
# or dev dependencies of ultimat3, so they live here and nowhere else.
#
#   bash bench/setup.sh            # create or update bench/.venv
#   PYTHON=python3.12 bash bench/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV=bench/.venv
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -e .
# Pinned so two runs of the bench compare the same peers; bump deliberately.
"$VENV/bin/python" -m pip install --quiet \
  "procrastinate==3.10.0" \
  "pgqueuer==1.6.0" \
  "asyncpg==0.32.0" \
  "pyinstrument==5.1.3" \
  "py-spy==0.4.3" \
  "rich>=13"
"$VENV/bin/python" - <<'PY'
from importlib.metadata import version
for name in ("ultimat3", "procrastinate", "pgqueuer", "psycopg", "pyinstrument", "py-spy"):
    try:
        print(f"{name:14s} {version(name)}")
    except Exception as exc:  # noqa: BLE001
        print(f"{name:14s} MISSING ({exc})")
PY
echo "bench venv ready: $VENV/bin/python bench/run.py --quick"
