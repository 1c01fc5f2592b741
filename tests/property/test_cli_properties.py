"""The ``x jobs`` commands with arbitrary arguments, on every database kind: exit 0, or exit 2 with a
coded error line (or click's own usage error for a malformed option) — never a traceback — and
never a changed row."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result
from hypothesis import given
from hypothesis import strategies as st

from ultimat3.cli import cli
from ultimat3.jobs.driver import EnqueueRequest, JobDriver

from .strategies import NASTY, PROPERTY, argv_texts

#: The CLI opens the store itself, so memory:// (one process's private store) cannot take part.
SHARED_ONLY = True

COMMANDS = st.one_of(
    st.tuples(st.just("show"), argv_texts).map(lambda t: ["jobs", "show", t[1]]),
    st.tuples(st.just("show"), argv_texts).map(lambda t: ["jobs", "show", t[1], "--json"]),
    st.tuples(st.just("cancel"), argv_texts).map(lambda t: ["jobs", "cancel", t[1], "--json"]),
    st.tuples(st.just("retry"), argv_texts).map(lambda t: ["jobs", "retry", t[1]]),
    argv_texts.map(lambda s: ["jobs", "ls", "--state", s]),
    argv_texts.map(lambda s: ["jobs", "ls", "--limit", s]),
    st.tuples(argv_texts, argv_texts, argv_texts).map(
        lambda t: ["jobs", "ls", "--queue", t[0], "--name", t[1], "--tenant", t[2], "--json"]),
    st.just(["jobs", "stats", "--json"]),
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
    assert result.exit_code in (0, 2), (result.exit_code, result.output)
    if result.exit_code == 2:
        coded = "error X_" in result.output
        usage = "Usage:" in result.output and "Error:" in result.output
        assert coded or usage, result.output
        assert "Traceback" not in result.output


@PROPERTY
@given(args=COMMANDS)
def test_jobs_commands_fail_coded_and_change_nothing(seeded: tuple[JobDriver, str], args: list[str]) -> None:
    driver, url = seeded
    before = snapshot(driver)
    result = CliRunner().invoke(cli, ["--database-url", url, *args])
    outcome_is_clean(result)
    assert snapshot(driver) == before


HOSTILE_ARGS = [value for value in NASTY if "\x00" not in value and "\ud800" not in value]


@pytest.mark.parametrize("value", HOSTILE_ARGS, ids=[repr(v)[:30] for v in HOSTILE_ARGS])
def test_hostile_arguments_fail_coded_and_change_nothing(seeded: tuple[JobDriver, str], value: str) -> None:
    driver, url = seeded
    before = snapshot(driver)
    for args in (["jobs", "show", value, "--json"], ["jobs", "cancel", value], ["jobs", "retry", value],
                 ["jobs", "ls", "--queue", value, "--name", value, "--tenant", value, "--json"]):
        result = CliRunner().invoke(cli, ["--database-url", url, *args])
        outcome_is_clean(result)
    assert snapshot(driver) == before
