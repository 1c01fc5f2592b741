#!/usr/bin/env bash
# Regenerate the profiles RESULTS.md cites, into bench/profiles/ (summaries, committed) and
# bench/out/profiles/ (py-spy's raw stacks, not committed). Run by hand after bench/setup.sh;
# takes about two minutes. Needs PostgreSQL at BENCH_ADMIN_URL's server (default 127.0.0.1:5432).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=bench/.venv/bin/python
BASE="${BENCH_PG:-postgresql://postgres@127.0.0.1:5432}"
RAW=bench/out/profiles
mkdir -p bench/profiles "$RAW"
SQLITE_DIR="$(mktemp -d)"
trap 'rm -rf "$SQLITE_DIR"; psql "$BASE/postgres" -qc "DROP DATABASE IF EXISTS bench_prof WITH (FORCE)" >/dev/null 2>&1 || true' EXIT

profile() {  # name, profile.py options..., -- command...
  local name=$1; shift
  "$PY" bench/profile.py --out "$RAW/$name" "$@" > /dev/null 2>&1
  mv "$RAW/$name.txt" "bench/profiles/$name.txt"
  echo "bench/profiles/$name.txt"
}

# Where a worker's Python time goes (GIL-holding samples only), PostgreSQL, concurrency 1 and 10.
profile pg_drain_c1_gil --gil --thread MainThread --thread x-io -- \
  bench/sys_ultimat3.py drain --url "$BASE/bench_prof" --n 5000 --concurrency 1
profile pg_drain_c10_gil --gil --thread MainThread --thread x-io -- \
  bench/sys_ultimat3.py drain --url "$BASE/bench_prof" --n 10000 --concurrency 10
# And at concurrency 100, where the client's CPU per job is the bound (issue 13's c=100 rows).
# At 1,000 samples a second over 60,000 jobs: the per-function shares RESULTS.md cites need that many.
profile pg_drain_c100_gil --rate 1000 --gil --thread MainThread --thread x-io -- \
  bench/sys_ultimat3.py drain --url "$BASE/bench_prof" --n 60000 --concurrency 100
# The same on the embedded SQLite driver.
profile sqlite_drain_c1_gil --gil --thread MainThread --thread x-io -- \
  bench/sys_ultimat3.py drain --url "sqlite:///$SQLITE_DIR/c1.db" --n 10000 --concurrency 1
profile sqlite_drain_c10_gil --gil --thread MainThread --thread x-io -- \
  bench/sys_ultimat3.py drain --url "sqlite:///$SQLITE_DIR/c10.db" --n 10000 --concurrency 10
# A backfill pass, wall clock (waiting on the database counts): the x-job thread runs the pass.
profile pg_backfill_sweep_wall --thread x-job -- \
  bench/backfill_bench.py sweep --url "$BASE/bench_prof" --rows 200000
# Batched enqueue, wall clock; the same on SQLite; and the server's share alone: an insert of
# server-generated rows into x_jobs with each index, then without them one by one.
profile pg_enqueue_batch_wall --thread MainThread -- \
  bench/sys_ultimat3.py enqueue --url "$BASE/bench_prof" --n 40000 --mode batch
# One enqueue per call, GIL-holding samples: the client's share of a single enqueue.
profile pg_enqueue_single_gil --gil --thread MainThread -- \
  bench/sys_ultimat3.py enqueue --url "$BASE/bench_prof" --n 10000 --mode single
profile sqlite_enqueue_batch_wall --thread MainThread -- \
  bench/sys_ultimat3.py enqueue --url "sqlite:///$SQLITE_DIR/e.db" --n 40000 --mode batch
"$PY" bench/index_cost.py > bench/profiles/pg_index_cost.txt
echo "bench/profiles/pg_index_cost.txt"
# The same on SQLite, where the insert runs in this process: each index's share, and what the
# driver's own job_insert adds by binding 21 named parameters per row (or by position).
"$PY" bench/index_cost_sqlite.py --tries 9 > bench/profiles/sqlite_index_cost.txt
echo "bench/profiles/sqlite_index_cost.txt"

# Per-call breakdown of a drain: seconds inside claim/ack vs the worker around them.
for c in 1 10; do
  "$PY" -c "import sys; sys.path.insert(0, 'bench'); import benchlib; benchlib.recreate_database('bench_prof')"
  "$PY" bench/sys_ultimat3.py drain --url "$BASE/bench_prof" --n 5000 --concurrency $c --variant timing \
    | tail -1 > "bench/profiles/pg_drain_c${c}_timing.json"
  echo "bench/profiles/pg_drain_c${c}_timing.json"
  rm -rf "$SQLITE_DIR"/t.db*  # the file, its WAL, and its workers directory
  "$PY" bench/sys_ultimat3.py drain --url "sqlite:///$SQLITE_DIR/t.db" --n 10000 --concurrency $c --variant timing \
    | tail -1 > "bench/profiles/sqlite_drain_c${c}_timing.json"
  echo "bench/profiles/sqlite_drain_c${c}_timing.json"
done

# A job's client-CPU budget: the primitives every attempt needs, the driver's calls, the worker's own.
"$PY" -c "import sys; sys.path.insert(0, 'bench'); import benchlib; benchlib.recreate_database('bench_prof')"
"$PY" bench/budget.py --url "$BASE/bench_prof" > bench/profiles/budget.txt
echo "bench/profiles/budget.txt"
