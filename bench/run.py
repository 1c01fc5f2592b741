"""ultimat3 side by side with procrastinate, pgqueuer and a bare-SQL floor, in one run.

Run by hand (never in CI or pytest), from the repository root, after ``bash bench/setup.sh``:

    bench/.venv/bin/python bench/run.py --quick          # < 2 minutes, small sizes
    bench/.venv/bin/python bench/run.py                  # the full sizes of the issue (~10 min)
    bench/.venv/bin/python bench/run.py --only drain,latency --repeat 3

Every system gets its own freshly created database on the same PostgreSQL (``bench_<system>``,
dropped at the end) and every case runs in its own process (one worker process per drain), so a
crash or a hang costs one cell of the table. Prints the tables and rewrites the generated part of
``bench/RESULTS.md`` (between the ``results`` markers; hand-written analysis around them is kept)
and the raw numbers to ``bench/out/results.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from benchlib import ADMIN_URL, checkpoint, drop_database, recreate_database, write_block  # noqa: E402

PY = sys.executable
BEGIN, END = "<!-- results:begin (written by bench/run.py) -->", "<!-- results:end -->"
SECTIONS = ("enqueue", "drain", "latency", "backfill", "pacer", "sqlite")
SYSTEMS = ("ours", "procrastinate", "pgqueuer", "floor")
SCRIPTS = {
    "ours": "sys_ultimat3.py",
    "procrastinate": "peers_procrastinate.py",
    "pgqueuer": "peers_pgqueuer.py",
    "floor": "floor_pg.py",
}
LABELS = {
    "ours": "ultimat3",
    "procrastinate": "procrastinate",
    "pgqueuer": "pgqueuer",
    "floor": "bare SQL floor",
}


@dataclass
class Case:
    """One measured cell: a group (table), a row label, how to run it, and what it returned."""

    group: str
    label: str
    system: str  # ours | peer | floor: which column of the ratios it feeds
    argv: list[str]
    database: str | None = None  # recreated before every run
    sqlite: bool = False
    results: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    note: str = ""
    env: dict[str, str] = field(default_factory=dict)
    loaded: bool = False  # results taken from the last run (--merge): not run again

    @property
    def result(self) -> dict[str, Any] | None:
        """The median run by its headline number."""
        if not self.results:
            return None
        key = "p50_ms" if "p50_ms" in self.results[0] else ("achieved" if "achieved" in self.results[0] else "rate")
        ordered = sorted(self.results, key=lambda r: r.get(key, 0))
        return ordered[len(ordered) // 2]


def run_case(case: Case, *, timeout: float, sqlite_dir: str) -> None:
    argv = list(case.argv)
    env = {**os.environ, **case.env}
    checkpoint()
    if case.database:
        url = recreate_database(case.database)
        argv = [a.replace("{url}", url) for a in argv]
        env["BENCH_URL"] = url
    if case.sqlite:
        stem = re.sub(r"\W+", "_", f"{case.group}_{case.label}").strip("_")
        for suffix in ("", "-wal", "-shm"):
            path = os.path.join(sqlite_dir, f"{stem}.db{suffix}")
            if os.path.exists(path):
                os.remove(path)
        url = "sqlite:///" + os.path.join(sqlite_dir, f"{stem}.db")
        argv = [a.replace("{url}", url) for a in argv]
    try:
        proc = subprocess.run([PY, *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        case.error = f"timed out after {timeout:.0f}s"
        return
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        case.error = f"exit {proc.returncode}: " + " | ".join(tail)
        return
    case.results.append(json.loads(line[len("RESULT ") :]))


# -- the plan ---------------------------------------------------------------------------------


def plan(args: argparse.Namespace) -> list[Case]:
    cases: list[Case] = []
    systems = [s for s in SYSTEMS if s in args.systems]
    n, batch = args.jobs, args.batch

    def script(system: str) -> str:
        return os.path.join("bench", SCRIPTS[system])

    if "enqueue" in args.only:
        for mode, title in (("single", "enqueue, one call per job"), ("batch", f"enqueue, batches of {batch}")):
            group = f"PostgreSQL {title} ({n:,} jobs)"
            for system in systems:
                argv = [script(system), "enqueue", "--url", "{url}", "--n", str(n), "--mode", mode,
                        "--batch", str(batch)]
                note = {
                    "ours": "handle.enqueue / enqueue_many (sync)",
                    "procrastinate": "task.defer / batch_defer (sync)",
                    "pgqueuer": "await Queries.enqueue (asyncpg)",
                    "floor": "INSERT / INSERT..unnest",
                }[system]
                cases.append(Case(group, LABELS[system], _role(system), argv, database=f"bench_{system}", note=note))

    if "drain" in args.only:
        for conc in DRAIN_CONCURRENCY:
            group = f"PostgreSQL drain, concurrency {conc} ({n:,} no-op jobs, one worker process)"
            for system in systems:
                base = [script(system), "drain", "--url", "{url}", "--n", str(n), "--concurrency", str(conc),
                        "--batch", str(batch)]
                if system == "ours":
                    timing = ["--variant", "timing"] if args.timing else []
                    cases.append(Case(group, LABELS[system], "ours", [*base, *timing],
                                      database="bench_ours",
                                      note="Worker.run() until the count, async handler, freeze_gc as x worker"))
                    if args.extras:
                        cases.append(Case(group, "ultimat3 (sync handler)", "info", [*base, "--variant", "sync"],
                                          database="bench_ours", note="plain def handler, thread pool"))
                        cases.append(Case(group, "ultimat3 (Worker.drain())", "info", [*base, "--variant", "drain"],
                                          database="bench_ours", note="the drain loop instead of run()"))
                        cases.append(Case(group, "ultimat3, synchronous_commit=off", "info", base,
                                          database="bench_ours", env={"PGOPTIONS": "-c synchronous_commit=off"},
                                          note="what-if: no WAL flush wait on claim/ack (PGOPTIONS)"))
                elif system == "procrastinate":
                    cases.append(Case(group, LABELS[system], "peer", base, database="bench_procrastinate",
                                      note=f"run_worker_async(concurrency={conc}, wait=False)"))
                elif system == "pgqueuer":
                    capped = "entrypoint" if conc == 1 else "budget"
                    note = ("@entrypoint(concurrency_limit=1), batch_size=1" if conc == 1
                            else f"max_concurrent_tasks={conc}, batch_size={conc // 2}")
                    cases.append(Case(group, LABELS[system], "peer", [*base, "--variant", capped],
                                      database="bench_pgqueuer", note=note))
                    cases.append(Case(group, f"pgqueuer (uncapped, batch_size={conc})", "info",
                                      [*base, "--variant", "batch"],
                                      database="bench_pgqueuer",
                                      note="no concurrency cap: in-flight jobs are NOT bounded by N"))
                    if args.extras:
                        # Not psycopg:entrypoint at N=1: that combination starts ~1 job per 2-3 s
                        # (measured: 189 jobs in 540 s), which would eat the whole run.
                        variant = "psycopg:batch" if conc == 1 else f"psycopg:{capped}"
                        cases.append(Case(group, "pgqueuer (psycopg driver)", "info",
                                          [*base, "--variant", variant], database="bench_pgqueuer",
                                          note="PsycopgDriver instead of asyncpg"
                                          + (", uncapped batch_size=1" if conc == 1 else f", {note}")))
                else:
                    label = "bare SQL floor, single" if conc == 1 else f"bare SQL floor, batched ({conc})"
                    cases.append(Case(group, label, "floor", base, database="bench_floor",
                                      note="claim 1 + ack 1 per job" if conc == 1
                                      else f"claim {conc} + ack {conc} in one statement each"))

    if "latency" in args.only:
        group = f"PostgreSQL enqueue-to-start latency, idle worker ({args.latency_jobs} jobs)"
        for system in systems:
            if system == "floor":
                continue
            argv = [script(system), "latency", "--url", "{url}", "--n", str(args.latency_jobs), "--gap", str(args.gap)]
            note = {
                "ours": "LISTEN/NOTIFY, poll_interval=1s",
                "procrastinate": "listen_notify=True (default), polling 5s",
                "pgqueuer": "LISTEN/NOTIFY, dequeue_timeout 30s (default)",
            }[system]
            cases.append(Case(group, LABELS[system], _role(system), argv, database=f"bench_{system}", note=note))

    if "backfill" in args.only and "ours" in systems:
        group = f"PostgreSQL backfill sweep ({args.rows:,} rows, batch 1000, UPDATE per batch)"
        bf = os.path.join("bench", "backfill_bench.py")
        cases.append(Case(group, "ultimat3 backfill()", "ours",
                          [bf, "sweep", "--url", "{url}", "--rows", str(args.rows), "--rate", str(args.sweep_rate)],
                          database="bench_bf_ours", note=f"run_backfill, rate={args.sweep_rate:g}/s (not binding)"))
        cases.append(Case(group, "ultimat3 backfill(), UPDATE through batch.connection", "info",
                          [bf, "sweep", "--url", "{url}", "--rows", str(args.rows), "--rate", str(args.sweep_rate),
                           "--variant", "joined"], database="bench_bf_ours",
                          note="exactly once: the UPDATE commits with the checkpoint, one COMMIT per batch"))
        if args.extras:
            cases.append(Case(group, "ultimat3 backfill(engine=plain)", "info",
                              [bf, "sweep", "--url", "{url}", "--rows", str(args.rows), "--rate", str(args.sweep_rate),
                               "--variant", "plain-engine"], database="bench_bf_ours",
                              note="what-if: engine without pool_pre_ping, autocommit reads"))
        cases.append(Case(group, "hand-written keyset loop", "floor",
                          [bf, "sweep-floor", "--url", "{url}", "--rows", str(args.rows)],
                          database="bench_bf_floor", note="SELECT page + the same UPDATE, psycopg"))

    if "pacer" in args.only and "ours" in systems:
        bf = os.path.join("bench", "backfill_bench.py")
        for rate, batches in args.pacer:
            group = "Backfill pacer: achieved vs declared batches/sec"
            cases.append(Case(group, f"backfill() at rate {rate:g} ({batches} batches)", "ours",
                              [bf, "pacer", "--url", "{url}", "--rate", str(rate), "--batches", str(batches)],
                              database="bench_bf_pacer", note="real pass, batch=1, stamps in handle()"))
            cases.append(Case(group, f"Pacer alone at rate {rate:g} ({batches} waits)", "info",
                              [bf, "pacer-only", "--rate", str(rate), "--batches", str(batches)],
                              note="Pacer.wait() in a loop, no database"))
            cases.append(Case(group, f"reference ScheduledPacer at rate {rate:g}", "info",
                              [bf, "pacer-only", "--rate", str(rate), "--batches", str(batches),
                               "--variant", "scheduled"],
                              note="slot-scheduled reference (bench/backfill_bench.py)"))

    if "sqlite" in args.only:
        for op, mode, conc, title in (
            ("enqueue", "single", 1, "enqueue, one call per job"),
            ("enqueue", "batch", 1, f"enqueue, batches of {batch}"),
            ("drain", "single", 1, "drain, concurrency 1"),
            ("drain", "single", 10, "drain, concurrency 10"),
        ):
            group = f"SQLite {title} ({n:,} jobs)"
            for system, path, role in (("ours", "sys_ultimat3.py", "ours"), ("floor", "floor_sqlite.py", "floor")):
                if system not in systems:
                    continue
                argv = [os.path.join("bench", path), op, "--url", "{url}", "--n", str(n), "--mode", mode,
                        "--concurrency", str(conc), "--batch", str(batch)]
                shape = "" if op == "enqueue" else (", single" if conc == 1 else f", batched ({conc})")
                label = "ultimat3 (sqlite driver)" if system == "ours" else "bare sqlite3 floor" + shape
                cases.append(Case(group, label, role, argv, sqlite=True))
    return cases


def _role(system: str) -> str:
    return {"ours": "ours", "floor": "floor"}.get(system, "peer")


# -- report -----------------------------------------------------------------------------------


def _fmt_rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _ratio(value: float | None, base: float | None, *, inverse: bool = False) -> str:
    if not value or not base:
        return "—"
    r = base / value if inverse else value / base
    return f"{r:.2f}×"


def tables(cases: list[Case]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) per group, in plan order."""
    out: list[tuple[str, list[str], list[list[str]]]] = []
    groups: dict[str, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.group, []).append(case)
    for group, members in groups.items():
        ours = next((c for c in members if c.system == "ours"), None)
        floor = next((c for c in members if c.system == "floor"), None)
        first = next((c.result for c in members if c.result), None) or {}
        rows: list[list[str]] = []
        if "p50_ms" in first:
            header = ["system", "p50 ms", "p90 ms", "p99 ms", "max ms", "p50 ×ours", "how"]
            base = ours.result["p50_ms"] if ours and ours.result else None
            for c in members:
                r = c.result
                if r is None:
                    rows.append([c.label, f"ERROR: {c.error}", "", "", "", "", c.note])
                    continue
                rows.append([c.label, f"{r['p50_ms']:.2f}", f"{r['p90_ms']:.2f}", f"{r['p99_ms']:.2f}",
                             f"{r['max_ms']:.1f}", _ratio(r["p50_ms"], base), c.note])
        elif "achieved" in first:
            header = ["run", "declared /s", "achieved /s", "error", "gap min..max ms", "how"]
            for c in members:
                r = c.result
                if r is None:
                    rows.append([c.label, f"ERROR: {c.error}", "", "", "", c.note])
                    continue
                rows.append([c.label, f"{r['declared']:g}", f"{r['achieved']:.2f}", f"{r['error_pct']:+.2f}%",
                             f"{r['min_gap_ms']:.1f}..{r['max_gap_ms']:.1f}", c.note])
        else:
            unit = "rows/s" if "rows" in first and "jobs" not in first else "jobs/s"
            header = ["system", unit, "×ours", "% of floor", "client CPU", "PG CPU", "client µs/job", "PG µs/job",
                      "how"]
            base = ours.result["rate"] if ours and ours.result else None
            fbase = floor.result["rate"] if floor and floor.result else None
            for c in members:
                r = c.result
                if r is None:
                    rows.append([c.label, f"ERROR: {c.error}", "", "", "", "", "", "", c.note])
                    continue
                pct = f"{100 * r['rate'] / fbase:.0f}%" if fbase else "—"
                per_client = f"{per_job(r, 'client_cpu_cores'):.0f}" if "client_cpu_cores" in r else ""
                per_server = f"{per_job(r, 'server_cpu_cores'):.0f}" if "server_cpu_cores" in r else ""
                client = f"{r['client_cpu_cores']:.2f}" if "client_cpu_cores" in r else ""
                server = f"{r['server_cpu_cores']:.2f}" if "server_cpu_cores" in r else ""
                verified = r.get("verified_done", r.get("verified"))
                expected = r.get("jobs", r.get("rows"))
                flag = "" if verified is None or verified >= expected else f" (only {verified} verified!)"
                if len(c.results) > 1:
                    rates = [x["rate"] for x in c.results]
                    spread = f" [{_fmt_rate(min(rates))}..{_fmt_rate(max(rates))}]"
                else:
                    spread = ""
                rows.append([c.label, _fmt_rate(r["rate"]) + spread + flag, _ratio(r["rate"], base), pct, client,
                             server, per_client, per_server, c.note])
        out.append((group, header, rows))
    return out


#: The drain cases' concurrencies: one attempt at a time, a usual worker, and a wide one.
DRAIN_CONCURRENCY = (1, 10, 100)


def per_job(result: dict[str, Any], key: str) -> float:
    """Microseconds of CPU per job (or row): cores busy divided by the rate."""
    return 1e6 * result[key] / result["rate"]


def targets(cases: list[Case]) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) for each goal of the issue."""

    def find(group_prefix: str, label: str) -> dict[str, Any] | None:
        for c in cases:
            if c.group.startswith(group_prefix) and c.label == label and c.result:
                return c.result
        return None

    out: list[tuple[str, str, bool | None]] = []

    def ratio(target: str, a: dict[str, Any] | None, b: dict[str, Any] | None, goal: float) -> None:
        if a and b:
            r = a["rate"] / b["rate"]
            out.append((target, f"{r:.2f}×", r >= goal))

    # Issue #13's table.
    for conc, floor_goal, peer_goal, peer_label in ((1, 0.6, None, ""), (10, 0.6, 1.5, "pgqueuer"),
                                                     (100, 0.5, 1.5, "pgqueuer (uncapped, batch_size=100)")):
        prefix = f"PostgreSQL drain, concurrency {conc} "
        ours = find(prefix, "ultimat3")
        floor = find(prefix, "bare SQL floor, single" if conc == 1 else f"bare SQL floor, batched ({conc})")
        kind = "single" if conc == 1 else f"batched({conc})"
        ratio(f"drain c={conc}: ≥ {floor_goal}× the {kind} floor", ours, floor, floor_goal)
        if peer_goal is not None:
            ratio(f"drain c={conc}: ≥ {peer_goal}× {peer_label}", ours, find(prefix, peer_label), peer_goal)
        if ours and conc > 1 and "client_cpu_cores" in ours:
            us = per_job(ours, "client_cpu_cores")
            out.append((f"drain c={conc}: client CPU ≤ 50 µs/job", f"{us:.0f} µs", us <= 50))
        if ours and floor and "server_cpu_cores" in ours and "server_cpu_cores" in floor:
            r = per_job(ours, "server_cpu_cores") / per_job(floor, "server_cpu_cores")
            out.append((f"drain c={conc}: PG CPU per job ≤ 2× the floor's", f"{r:.2f}×", r <= 2))
    ratio("enqueue, one call per job: ≥ 0.8× floor", find("PostgreSQL enqueue, one call", "ultimat3"),
          find("PostgreSQL enqueue, one call", "bare SQL floor"), 0.8)
    ratio("enqueue_many: ≥ 0.5× floor", find("PostgreSQL enqueue, batches", "ultimat3"),
          find("PostgreSQL enqueue, batches", "bare SQL floor"), 0.5)
    ratio("enqueue_many: ≥ pgqueuer", find("PostgreSQL enqueue, batches", "ultimat3"),
          find("PostgreSQL enqueue, batches", "pgqueuer"), 1.0)
    ratio("SQLite drain c=10: ≥ 0.4× floor", find("SQLite drain, concurrency 10", "ultimat3 (sqlite driver)"),
          find("SQLite drain, concurrency 10", "bare sqlite3 floor, batched (10)"), 0.4)
    ratio("SQLite enqueue_many: ≥ 0.4× floor", find("SQLite enqueue, batches", "ultimat3 (sqlite driver)"),
          find("SQLite enqueue, batches", "bare sqlite3 floor"), 0.4)
    lat = find("PostgreSQL enqueue-to-start", "ultimat3")
    if lat:
        out.append(("enqueue-to-start p50 < 5 ms", f"{lat['p50_ms']:.2f} ms (p99 {lat['p99_ms']:.2f})",
                    lat["p50_ms"] < 5))
    sweep = find("PostgreSQL backfill sweep", "ultimat3 backfill()")
    hand = find("PostgreSQL backfill sweep", "hand-written keyset loop")
    if sweep and hand:
        r = sweep["rate"] / hand["rate"]
        out.append(("backfill sweep ≥ 0.9× the hand-written loop", f"{r:.2f}×", r >= 0.9))
    for c in cases:
        if c.group.startswith("Backfill pacer") and c.system == "ours" and c.result:
            e = c.result["error_pct"]
            out.append((f"pacer within 2% at rate {c.result['declared']:g}", f"{e:+.2f}%", abs(e) <= 2))
    return out


def print_report(cases: list[Case]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        for title, header, rows in tables(cases):
            print(f"\n{title}\n  " + " | ".join(header))
            for row in rows:
                print("  " + " | ".join(row))
        for target, measured, met in targets(cases):
            print(f"  {'MET ' if met else 'MISS'} {target}: {measured}")
        return
    console = Console(width=160)
    for title, header, rows in tables(cases):
        table = Table(title=title, title_justify="left", show_lines=False)
        for i, column in enumerate(header):
            table.add_column(column, justify="left" if i in (0, len(header) - 1) else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    table = Table(title="Targets (goals, not assertions)", title_justify="left")
    for column in ("target", "measured", ""):
        table.add_column(column)
    for target, measured, met in targets(cases):
        table.add_row(target, measured, "[green]met[/]" if met else "[red]MISSED[/]")
    console.print(table)


# -- environment ------------------------------------------------------------------------------


def environment() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    info: dict[str, str] = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")}
    info["nproc"] = str(os.cpu_count())
    try:
        with open("/proc/meminfo") as fh:
            kb = int(next(line for line in fh if line.startswith("MemTotal")).split()[1])
        info["memory"] = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration):
        info["memory"] = "?"
    try:
        with open("/proc/cpuinfo") as fh:
            info["cpu"] = next(line for line in fh if line.startswith("model name")).split(":", 1)[1].strip()
    except (OSError, StopIteration):
        info["cpu"] = platform.processor() or "?"
    info["kernel"] = platform.release()
    info["python"] = platform.python_version()
    import sqlite3

    info["sqlite"] = sqlite3.sqlite_version
    for name in ("ultimat3", "procrastinate", "pgqueuer", "psycopg", "psycopg-pool", "asyncpg", "sqlalchemy"):
        try:
            info[name] = version(name)
        except PackageNotFoundError:
            info[name] = "not installed"
    try:
        import psycopg

        with psycopg.connect(ADMIN_URL) as conn:
            info["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
            settings = []
            for name in ("shared_buffers", "synchronous_commit", "fsync", "wal_sync_method", "max_connections"):
                settings.append(f"{name}={conn.execute(f'SHOW {name}').fetchone()[0]}")
            info["postgresql settings"] = ", ".join(settings)
    except Exception as exc:
        info["postgresql"] = f"unreachable ({exc})"
    return info


def markdown(cases: list[Case], env: dict[str, str], args: argparse.Namespace, seconds: float) -> str:
    lines = [BEGIN, "", f"Run: `{args.command_line}` — {seconds:.0f} s, {env['date']}.", ""]
    lines += ["| machine / version | |", "| --- | --- |"]
    for key in ("date", "cpu", "nproc", "memory", "kernel", "python", "postgresql", "postgresql settings", "sqlite",
                "ultimat3", "procrastinate", "pgqueuer", "psycopg", "psycopg-pool", "asyncpg", "sqlalchemy"):
        lines.append(f"| {key} | {env.get(key, '?')} |")
    lines.append("")
    lines.append("PostgreSQL and the clients share the machine's cores. *client CPU* / *PG CPU*: CPU seconds per "
                 "wall second of the bench process and of all PostgreSQL processes (1.00 = one core busy).")
    lines.append("")
    for title, header, rows in tables(cases):
        lines.append(f"### {title}")
        lines.append("")
        lines.append("| " + " | ".join(header) + " |")
        rule = ("---" if i in (0, len(header) - 1) else "---:" for i in range(len(header)))
        lines.append("| " + " | ".join(rule) + " |")
        for row in rows:
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
        lines.append("")
    lines.append("### Targets (goals, not assertions)")
    lines.append("")
    lines.append("| target | measured | |")
    lines.append("| --- | ---: | --- |")
    for target, measured, met in targets(cases):
        lines.append(f"| {target} | {measured} | {'met' if met else '**missed**'} |")
    lines += ["", END]
    return "\n".join(lines)


def write_results(text: str) -> None:
    write_block(BEGIN, END, text)


# -- main -------------------------------------------------------------------------------------


def _pacer_spec(text: str) -> list[tuple[float, int]]:
    out = []
    for part in text.split(","):
        rate, _, batches = part.partition(":")
        out.append((float(rate), int(batches)))
    return out


def _merged(run: list[Case], args: argparse.Namespace) -> list[Case]:
    """The whole plan: ``run`` (to be run now) and, for every other case, the results the last
    run wrote to bench/out/results.json (marked run, so the loop skips them)."""
    with open(os.path.join(HERE, "out", "results.json")) as fh:
        previous = {(c["group"], c["label"]): c for c in json.load(fh)["cases"]}
    fresh = {(c.group, c.label) for c in run}
    only = args.only
    args.only = set(SECTIONS)
    try:
        everything = plan(args)
    finally:
        args.only = only
    merged = []
    for case in everything:
        if (case.group, case.label) in fresh:
            merged.append(next(c for c in run if (c.group, c.label) == (case.group, case.label)))
            continue
        old = previous.get((case.group, case.label))
        if old is None:
            continue
        case.results, case.error, case.note = old["results"], old["error"], old["note"]
        case.loaded = True
        merged.append(case)
    return merged


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes: the whole run in under 2 minutes")
    p.add_argument("--jobs", type=int, help="jobs per enqueue and drain case (default 20000; quick 2000)")
    p.add_argument("--batch", type=int, default=1000, help="jobs per batch enqueue call")
    p.add_argument("--latency-jobs", type=int, help="jobs in the latency case (default 500; quick 100)")
    p.add_argument("--gap", type=float, default=0.02, help="seconds between latency enqueues (jittered ±50%%)")
    p.add_argument("--rows", type=int, help="rows in the backfill sweep (default 200000; quick 20000)")
    p.add_argument("--sweep-rate", type=float, default=10_000, help="declared rate of the sweep (must not bind)")
    p.add_argument("--pacer", type=_pacer_spec, help='rate:batches,... (default "5:20,50:100,500:500")')
    p.add_argument("--only", default=",".join(SECTIONS), help=f"sections, comma-separated: {', '.join(SECTIONS)}")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"systems: {', '.join(SYSTEMS)}")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs per throughput case, round-robin over the plan; the median is reported "
                        "(latency and pacer cases run once)")
    p.add_argument("--extras", action="store_true",
                   help="also: sync handler, Worker.drain(), synchronous_commit=off, pgqueuer on psycopg, "
                        "backfill with a plain engine")
    p.add_argument("--timing", action="store_true", help="break our drain down by driver call (adds overhead)")
    p.add_argument("--timeout", type=float, default=900, help="seconds before a case is abandoned")
    p.add_argument("--merge", action="store_true",
                   help="cases of the sections not in --only keep their results from bench/out/results.json "
                        "(re-run one section without losing the others)")
    p.add_argument("--no-write", action="store_true",
                   help="do not touch RESULTS.md or bench/out/results.json (what --merge reads)")
    p.add_argument("--keep-dbs", action="store_true", help="leave the bench_* databases behind")
    args = p.parse_args()
    args.command_line = "python bench/run.py " + " ".join(sys.argv[1:])
    quick = args.quick
    args.jobs = args.jobs or (2000 if quick else 20_000)
    args.latency_jobs = args.latency_jobs or (100 if quick else 500)
    args.rows = args.rows or (20_000 if quick else 200_000)
    if not args.pacer:
        args.pacer = [(5.0, 10), (50.0, 50), (500.0, 200)] if quick else [(5.0, 20), (50.0, 100), (500.0, 500)]
    args.only = set(args.only.split(","))
    args.systems = set(args.systems.split(","))
    unknown = (args.only - set(SECTIONS)) | (args.systems - set(SYSTEMS))
    if unknown:
        p.error(f"unknown section or system: {', '.join(sorted(unknown))}")

    cases = plan(args)
    if args.merge:
        cases = _merged(cases, args)
    sqlite_dir = tempfile.mkdtemp(prefix="ultimat3-bench-")
    databases = sorted({c.database for c in cases if c.database})
    started = time.perf_counter()
    try:
        # Repeats go round the whole plan, so a noisy minute (a checkpoint, the VM's disk) is
        # spread over every system instead of landing on one.
        for round_ in range(args.repeat):
            for index, case in enumerate(cases, 1):
                single = case.group.startswith(("Backfill pacer", "PostgreSQL enqueue-to-start"))
                if case.error or (single and round_ > 0) or case.loaded:
                    continue
                t0 = time.perf_counter()
                run_case(case, timeout=args.timeout, sqlite_dir=sqlite_dir)
                status = "error: " + case.error if case.error else json.dumps(case.results[-1])[:150]
                print(f"[{round_ + 1}/{args.repeat} {index:2d}/{len(cases)}] {time.perf_counter() - t0:6.1f}s  "
                      f"{case.group[:44]:44s} {case.label[:34]:34s} {status}", flush=True)
    finally:
        shutil.rmtree(sqlite_dir, ignore_errors=True)
        if not args.keep_dbs:
            for name in databases:
                try:
                    drop_database(name)
                except Exception as exc:
                    print(f"could not drop {name}: {exc}", file=sys.stderr)
    seconds = time.perf_counter() - started
    print()
    print_report(cases)
    if args.no_write:  # a look, not a record: the last written run stays what --merge builds on
        return 0
    env = environment()
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    with open(os.path.join(HERE, "out", "results.json"), "w") as fh:
        json.dump({"environment": env, "command": args.command_line, "seconds": seconds,
                   "cases": [{"group": c.group, "label": c.label, "role": c.system, "argv": c.argv,
                              "results": c.results, "error": c.error, "note": c.note} for c in cases]}, fh, indent=1)
    write_results(markdown(cases, env, args, seconds))
    print(f"\nwrote bench/RESULTS.md and bench/out/results.json ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
