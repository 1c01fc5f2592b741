"""Profile one bench case under py-spy and summarise where the time goes.

    bench/.venv/bin/python bench/profile.py --out bench/profiles/drain_c1 -- \\
        bench/sys_ultimat3.py drain --url postgresql://.../bench_prof --n 5000 --concurrency 1

Writes ``<out>.raw`` (py-spy's collapsed stacks, wall clock, idle included: time spent waiting on
the database counts, because that is where a queue spends it), ``<out>.svg`` with ``--svg`` (a
flame graph, from a second run) and ``<out>.txt`` (the summary printed here: inclusive and self
time per function, and the busiest ultimat3 frames; ``--thread NAME`` adds one per thread).
Recreates the database named in ``--url`` first when it is PostgreSQL.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from benchlib import recreate_database  # noqa: E402

PY_SPY = os.path.join(os.path.dirname(sys.executable), "py-spy")


def summarise(raw: str, *, top: int = 40, threads: bool = True, thread: str | None = None) -> str:
    """Inclusive/self time per frame; ``thread``: only stacks of threads whose name contains it
    (percentages are then of that thread's samples)."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    per_thread: collections.Counter[str] = collections.Counter()
    total = 0
    with open(raw) as fh:
        for line in fh:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n = int(count)
            frames = stack.split(";")
            if thread is not None and not any(thread in f for f in frames[:2]):
                continue
            total += n
            per_thread[frames[0]] += n
            seen: set[str] = set()
            for frame in frames[1:] if threads else frames:
                if frame not in seen:
                    inclusive[frame] += n
                    seen.add(frame)
            own[frames[-1]] += n
    out = [f"samples: {total}", "", "per thread (wall clock, idle included):"]
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in per_thread.most_common(12)]
    out += ["", f"inclusive, top {top}:"]
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    out += ["", "ultimat3 frames (inclusive):"]
    ours = [(name, n) for name, n in inclusive.items() if "ultimat3/" in name or "ultimat3." in name]
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in sorted(ours, key=lambda x: -x[1])[:30]]
    out += ["", "self, top 25:"]
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(25)]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="path prefix for .raw/.svg/.txt")
    p.add_argument("--rate", type=int, default=250, help="samples per second")
    p.add_argument("--svg", action="store_true", help="also record a flame graph (a second run)")
    p.add_argument("--no-idle", action="store_true", help="drop samples py-spy sees as idle")
    p.add_argument("--gil", action="store_true", help="only samples holding the GIL: the Python CPU work")
    p.add_argument("--thread", action="append", default=[],
                   help="also summarise the threads whose name contains this (repeatable), e.g. x-job, MainThread")
    p.add_argument("--summarise", metavar="RAW", help="only summarise an existing .raw file")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- script.py args...")
    args = p.parse_args()
    if args.summarise:
        print(summarise(args.summarise))
        for name in args.thread:
            print(f"\n===== thread {name} =====\n" + summarise(args.summarise, thread=name))
        return
    command = [c for c in args.command if c != "--"]
    joined = " ".join(command)
    match = re.search(r"--url[ =](postgres(?:ql)?://\S+/(\w+))", joined)
    if match:
        recreate_database(match.group(2))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    base = [PY_SPY, "record", "-r", str(args.rate), "--threads", "--subprocesses"]
    if args.gil:
        base.append("--gil")
    elif not args.no_idle:
        base.append("--idle")
    subprocess.run([*base, "-f", "raw", "-o", args.out + ".raw", "--", sys.executable, *command], check=True)
    if args.svg:
        if match:
            recreate_database(match.group(2))
        subprocess.run([*base, "-f", "flamegraph", "-o", args.out + ".svg", "--", sys.executable, *command],
                       check=True, stdout=subprocess.DEVNULL)
    text = summarise(args.out + ".raw")
    for name in args.thread:
        text += f"\n\n===== thread {name} =====\n" + summarise(args.out + ".raw", thread=name)
    with open(args.out + ".txt", "w") as fh:
        fh.write(f"$ {joined}\n\n{text}\n")
    print(text)


if __name__ == "__main__":
    main()
