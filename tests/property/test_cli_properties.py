"""Every ``x`` command with arbitrary arguments, on every shareable database kind: exit 0 (or 1 for
a gate that found work pending), or exit 2 with exactly one coded ``error X_...`` line and one
``hint:`` line on stderr — never click's own usage text, never a traceback — and never a changed row."""

from __future__ import annotations

import re
from collections.abc import Iterator
from unittest.mock import patch

import pytest
from click.testing import CliRunner, Result
from hypothesis import given
from hypothesis import strategies as st

from ultimat3.cli import cli
from ultimat3.drivers.protocol import EnqueueRequest, JobDriver

from .strategies import NASTY, PROPERTY, argv_texts

#: The CLI opens the store itself, so memory:// (one process's private store) cannot take part.
SHARED_ONLY = True

COMMANDS = st.one_of(
    argv_texts.map(lambda s: ["--env", s, "jobs", "stats"]),
    argv_texts.map(lambda s: ["--log-level-typo", s]),
    argv_texts.map(lambda s: ["jobs", "ls", "--bogus-option", s]),
    argv_texts.map(lambda s: ["db", "prune", "--older-than", s, "--json"]),
    argv_texts.map(lambda s: ["db", "backfill", s, "--dry-run"]),
    argv_texts.map(lambda s: ["db", "backfill", s, "--json"]),
    argv_texts.map(lambda s: ["db", "backfill", "--check", s]),
    st.just(["db", "backfill", "--check"]),
    st.just(["db", "backfill", "--pending", "--json"]),
    argv_texts.map(lambda s: ["worker", "--concurrency", s, "--log-level", s]),
    argv_texts.map(lambda s: ["worker", "--log-format", s]),
    argv_texts.map(lambda s: ["worker", "--visibility-timeout", s]),
    argv_texts.map(lambda s: ["db", s]),
    argv_texts.map(lambda s: [s]),
    st.tuples(st.just("show"), argv_texts).map(lambda t: ["jobs", "show", t[1]]),
    st.tuples(st.just("show"), argv_texts).map(lambda t: ["jobs", "show", t[1], "--json"]),
    st.tuples(st.just("cancel"), argv_texts).map(lambda t: ["jobs", "cancel", t[1], "--json"]),
    st.tuples(st.just("retry"), argv_texts).map(lambda t: ["jobs", "retry", t[1]]),
    argv_texts.map(lambda s: ["jobs", "ls", "--state", s]),
    argv_texts.map(lambda s: ["jobs", "ls", "--limit", s]),
    st.tuples(argv_texts, argv_texts, argv_texts).map(
        lambda t: ["jobs", "ls", "--queue", t[0], "--name", t[1], "--tenant", t[2], "--json"]),
    st.just(["jobs", "stats", "--json"]),
    # Incident tools: hostile filter values (bulk actions as dry runs, or aimed away from the seeded
    # queue, so "never a changed row" still holds).
    argv_texts.map(lambda s: ["jobs", "retry", "--queue", s, "--dry-run"]),
    argv_texts.map(lambda s: ["jobs", "cancel", "--name", s, "--error", s, "--dry-run", "--json"]),
    argv_texts.map(lambda s: ["jobs", "cancel", "--queue", "cli-none", "--name", s, "--error", s, "--yes"]),
    argv_texts.map(lambda s: ["jobs", "delete", "--since", s, "--dry-run"]),
    argv_texts.map(lambda s: ["jobs", "delete", "--queue", "cli-none", "--until", s, "--json"]),
    argv_texts.map(lambda s: ["jobs", "retry", "--ids", s, "--dry-run"]),
    argv_texts.map(lambda s: ["jobs", "ls", "--state", "dead", "--group-by", s]),
    argv_texts.map(lambda s: ["jobs", "ls", "--error", s, "--since", s, "--group-by", "error", "--json"]),
    argv_texts.map(lambda s: ["queues", s]),
    argv_texts.map(lambda s: ["audit", "ls", "--action", s, "--json"]),
    st.just(["queues", "ls", "--json"]),
    argv_texts.map(lambda s: ["schedules", "run", s]),
    argv_texts.map(lambda s: ["schedules", "pause", s, "--json"]),
    st.just(["schedules", "ls", "--json"]),
)


@pytest.fixture(scope="module")
def seeded(driver: JobDriver, driver_url: str) -> Iterator[tuple[JobDriver, str]]:
    """A few jobs to list, so a changed row would show."""
    driver.enqueue_many([EnqueueRequest(name="cli.prop", payload={"i": i}, queue="cli") for i in range(3)])
    yield driver, driver_url


def snapshot(driver: JobDriver) -> list[tuple[str, str, int, object]]:
    return sorted((job.id, job.state, job.attempt, job.updated_at) for job in driver.introspect.list())


def outcome_is_clean(result: Result) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"uncaught {type(result.exception).__name__}: {result.exception}\n{result.output}")
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.output)
    if result.exit_code == 2:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 2, result.stderr
        assert re.fullmatch(r"error X_[A-Z0-9_]+: .+", lines[0]), lines[0]
        assert lines[1].startswith("  hint: ") and len(lines[1]) > len("  hint: "), lines[1]
        assert "Traceback" not in result.output and "Usage:" not in result.output
        assert not CONTROL.search(result.stderr.replace("\n", "")), "control characters reach the terminal"


#: Raw control characters (ESC, BEL, CR...) that must never be printed from a value.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def run(url: str, args: list[str]) -> Result:
    # A worker that parsed its options would start for real: its loop is replaced, its checks are not.
    with patch("ultimat3.jobs.worker.Worker.run_forever", lambda self: None):
        return CliRunner().invoke(cli, ["--database-url", url, *args])


@PROPERTY
@given(args=COMMANDS)
def test_jobs_commands_fail_coded_and_change_nothing(seeded: tuple[JobDriver, str], args: list[str]) -> None:
    driver, url = seeded
    before = snapshot(driver)
    outcome_is_clean(run(url, args))
    assert snapshot(driver) == before


HOSTILE_ARGS = [value for value in NASTY if "\x00" not in value and "\ud800" not in value]


@pytest.mark.parametrize("value", HOSTILE_ARGS, ids=[repr(v)[:30] for v in HOSTILE_ARGS])
def test_hostile_arguments_fail_coded_and_change_nothing(seeded: tuple[JobDriver, str], value: str) -> None:
    driver, url = seeded
    before = snapshot(driver)
    for args in (["jobs", "show", value, "--json"], ["jobs", "cancel", value], ["jobs", "retry", value],
                 ["jobs", "ls", "--queue", value, "--name", value, "--tenant", value, "--json"],
                 ["jobs", "ls", "--limit", value], ["jobs", "ls", "--state", value], ["--env", value, "jobs", "ls"],
                 ["db", "backfill", value, "--wait"], ["db", "prune", "--older-than", value],
                 ["worker", "--concurrency", value], ["--app", value, "jobs", "stats"]):
        outcome_is_clean(run(url, args))
    assert snapshot(driver) == before
