"""PostgreSQL-only behaviour of the postgres driver; the shared semantics live in tests/contract.

Each test module run gets its own schema (``search_path`` in the URL) and each driver its own
NOTIFY channel, so these tests neither see nor disturb anyone else using the same database. The
server is ``X_TEST_DATABASE_URL``; unreachable, the tests skip locally and fail in CI.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import pytest

from ultimat3.core.clock import ManualClock, system_clock, to_datetime
from ultimat3.drivers.postgres.driver import PostgresDriver, conninfo_from_url
from ultimat3.drivers.postgres.listener import WAKE_ALL
from ultimat3.drivers.protocol import Ack, ClaimRequest, EnqueueRequest, JobDriver, JobFilter, NackRequest
from ultimat3.drivers.sql import load_migrations, load_queries, parse_queries
from ultimat3.jobs.errors import DriverError, JobDuplicateError

pytestmark = pytest.mark.postgres
QUERIES = load_queries("ultimat3.drivers.postgres")

DEFAULT_TEST_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _base_url() -> str:
    return os.environ.get("X_TEST_DATABASE_URL") or DEFAULT_TEST_DATABASE_URL


def _with_params(url: str, **params: str) -> str:
    """``url`` with these libpq URI parameters set (replacing any of the same name)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update(params)
    return urlunsplit(parts._replace(query=urlencode(query)))


@pytest.fixture(scope="module")
def admin_url() -> str:
    """The server's URL without a schema, checked for reachability once."""
    url = _base_url()
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except Exception as exc:
        reason = f"PostgreSQL at X_TEST_DATABASE_URL={url} is unreachable: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return url


@pytest.fixture(scope="module")
def schema(admin_url: str) -> Iterator[str]:
    """A schema of this module's own, dropped afterwards."""
    name = f"x_unit_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{name}" CASCADE')


@pytest.fixture(scope="module")
def url(admin_url: str, schema: str) -> str:
    """The URL every driver here uses: the module's schema first on the search path."""
    return _with_params(admin_url, options=f"-csearch_path={schema}")


@pytest.fixture(scope="module")
def migrated(url: str) -> str:
    """``url`` once the library's tables exist in the module's schema."""
    driver = PostgresDriver(url)
    try:
        driver.migrate()
    finally:
        driver.close()
    return url


@pytest.fixture
def channel() -> str:
    """A NOTIFY channel no other test (or process) shares."""
    return f"x_jobs_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_driver(migrated: str, channel: str) -> Iterator[Callable[..., PostgresDriver]]:
    """Build drivers on the migrated schema and the test's channel; all closed after the test."""
    built: list[PostgresDriver] = []
    with psycopg.connect(migrated, autocommit=True) as conn:
        conn.execute("TRUNCATE x_jobs, x_job_steps, x_backfills, x_leases")

    def make(**kwargs: Any) -> PostgresDriver:
        kwargs.setdefault("channel", channel)
        driver = PostgresDriver(kwargs.pop("url", migrated), **kwargs)
        built.append(driver)
        return driver

    yield make
    for driver in built:
        driver.close()


class Seen:
    """A subscriber that records queues and lets a test wait (on an event, never a sleep)."""

    def __init__(self) -> None:
        self.queues: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, queue: str) -> None:
        with self._cond:
            self.queues.append(queue)
            self._cond.notify_all()

    def wait_for(self, queue: str, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: queue in self.queues, timeout)


def _job(name: str = "task", **fields: Any) -> EnqueueRequest:
    return EnqueueRequest(name=name, payload={}, **fields)


# -- no server needed ---------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["postgres", "postgresql", "postgresql+psycopg", "PostgreSQL"])
def test_every_postgres_scheme_is_accepted(scheme: str) -> None:
    assert conninfo_from_url(f"{scheme}://u@h:5432/db?sslmode=disable") == "postgresql://u@h:5432/db?sslmode=disable"


@pytest.mark.parametrize("url", ["mysql://u@h/db", "postgresql:/nope", "sqlite:///x.db"])
def test_other_urls_are_refused_with_a_code(url: str) -> None:
    with pytest.raises(DriverError) as caught:
        conninfo_from_url(url)
    assert caught.value.code == "X_DATABASE_URL"


def test_queries_file_parses_into_named_statements_without_comments() -> None:
    parsed = parse_queries("ignored\n-- name: one\n-- 100% a comment\nSELECT 1\n\n-- name: two\nSELECT 2\n")
    assert parsed == {"one": "SELECT 1", "two": "SELECT 2"}
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n")


def test_no_statement_reads_the_servers_clock() -> None:
    # Every time is the driver's clock, passed in: the contract suite moves a ManualClock. Only the
    # sample that the default clock (ReferenceClock) takes of the server's time reads it, and the age
    # of a server-side transaction start (pg_stat_activity), which only the server's clock can measure.
    for name, text in QUERIES.items():
        if name in ("server_time", "oldest_snapshot"):
            continue
        lowered = text.lower()
        for forbidden in ("now()", "current_timestamp", "clock_timestamp", "localtimestamp"):
            assert forbidden not in lowered, f"query {name} reads the server clock ({forbidden})"


def test_migrations_are_numbered_and_prefixed() -> None:
    ids = [migration.id for migration in load_migrations("ultimat3.drivers.postgres")]
    assert ids[0] == "x:0001_init"
    assert ids == sorted(ids)


# -- against the server -------------------------------------------------------------------------


def test_concurrent_migrate_applies_each_file_once(admin_url: str) -> None:
    schema = f"x_unit_mig_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = _with_params(admin_url, options=f"-csearch_path={schema}")
    drivers = [PostgresDriver(url, min_size=1, max_size=1) for _ in range(4)]
    results: list[list[str]] = []
    barrier = threading.Barrier(len(drivers))

    def boot(driver: PostgresDriver) -> None:
        barrier.wait()
        results.append(driver.migrate())

    try:
        threads = [threading.Thread(target=boot, args=(driver,)) for driver in drivers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        library = [migration.id for migration in load_migrations("ultimat3.drivers.postgres")]
        assert len(results) == 4
        # Each file applied by exactly one of them (not necessarily all by the same one).
        assert sorted(mid for applied in results for mid in applied) == library
        assert [record.id for record in drivers[0].migrations.applied()] == library
    finally:
        for driver in drivers:
            driver.close()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_notify_wakes_a_subscriber_of_another_driver_within_a_second(
    make_driver: Callable[..., PostgresDriver],
) -> None:
    worker, app = make_driver(), make_driver()
    seen = Seen()
    worker.subscribe(seen)  # returns once LISTEN is in effect
    started = time.monotonic()
    app.enqueue(_job(queue="mail"))
    assert seen.wait_for("mail", timeout=1.0)
    print(f"\nNOTIFY delivered {1000 * (time.monotonic() - started):.1f} ms after the enqueue call")


@pytest.mark.parametrize("settle", ["ack", "ack_many", "nack"])
def test_a_freed_concurrency_slot_wakes_the_workers_of_other_processes(
    make_driver: Callable[..., PostgresDriver], settle: str
) -> None:
    worker, app = make_driver(), make_driver()
    for queue, key in (("gov", "k"), ("plain", None)):
        app.enqueue(_job(queue=queue, flow_key=key, flow_max=None if key is None else 1))
    claimed = {c.job.queue: c for c in app.claim(ClaimRequest(worker_id="w", limit=5, flow=True))}
    assert set(claimed) == {"gov", "plain"}
    seen = Seen()
    worker.subscribe(seen)
    for queue in ("plain", "gov"):  # the plain one first: it announces nothing, so "gov" comes alone
        held = claimed[queue]
        if settle == "ack":
            assert app.ack(held.job.id, held.claim_token)
        elif settle == "ack_many":
            assert app.ack_many([Ack(held.job.id, held.claim_token)]) == [True]
        else:
            assert app.nack(held.job.id, held.claim_token, NackRequest(error="boom", delay=60))
    assert seen.wait_for("gov", timeout=5.0)
    assert "plain" not in seen.queues


def test_listener_reconnects_after_its_backend_is_terminated(
    make_driver: Callable[..., PostgresDriver], admin_url: str
) -> None:
    worker, app = make_driver(), make_driver()
    seen = Seen()
    worker.subscribe(seen)
    listener = worker.listener
    assert listener is not None
    old_pid = listener.backend_pid
    assert old_pid is not None
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", [old_pid])
    # Back and listening: every subscriber is told to re-poll, since notifications were missed.
    assert seen.wait_for(WAKE_ALL, timeout=10.0)
    assert listener.backend_pid not in (None, old_pid)
    app.enqueue(_job(queue="after-restart"))
    assert seen.wait_for("after-restart", timeout=1.0)


def test_close_stops_the_listener_promptly(make_driver: Callable[..., PostgresDriver]) -> None:
    driver = make_driver()
    driver.subscribe(Seen())
    listener = driver.listener
    assert listener is not None
    started = time.monotonic()
    driver.close()
    assert time.monotonic() - started < 1.0
    assert not listener.listening
    with pytest.raises(DriverError) as caught:
        driver.subscribe(Seen())
    assert caught.value.code == "X_DRIVER_CLOSED"


def test_own_enqueues_wake_in_process_subscribers(make_driver: Callable[..., PostgresDriver]) -> None:
    driver = make_driver()
    seen = Seen()
    unsubscribe = driver.subscribe(seen)
    driver.enqueue_many([_job(queue="a"), _job(queue="b")])
    assert seen.wait_for("a", 1.0)
    assert seen.wait_for("b", 1.0)
    unsubscribe()


def test_transactional_enqueue_through_psycopg_rolls_back_with_the_caller(
    make_driver: Callable[..., PostgresDriver], migrated: str
) -> None:
    driver, watcher_driver = make_driver(), make_driver()
    seen = Seen()
    watcher_driver.subscribe(seen)
    with psycopg.connect(migrated) as conn:  # not autocommit: the caller's own transaction
        result = driver.enqueue(_job(queue="rolled-back"), connection=conn)
        batch = driver.enqueue_many([_job(queue="rolled-back"), _job(queue="rolled-back")], connection=conn)
        # Uncommitted: invisible to everyone else, the driver's own pool included.
        assert driver.introspect.get(result.id) is None
        conn.rollback()
        for job_id in [result.id, *(item.id for item in batch)]:
            assert driver.introspect.get(job_id) is None

        kept = driver.enqueue(_job(queue="committed"), connection=conn)
        assert driver.introspect.get(kept.id) is None
        conn.commit()
    assert driver.introspect.get(kept.id) is not None
    # Notifications arrive in commit order: "committed" arriving proves "rolled-back" never will.
    assert seen.wait_for("committed", timeout=1.0)
    assert "rolled-back" not in seen.queues


def test_transactional_enqueue_many_failure_leaves_the_callers_transaction_usable(
    make_driver: Callable[..., PostgresDriver], migrated: str
) -> None:
    driver = make_driver()
    with psycopg.connect(migrated) as conn:
        conn.execute("CREATE TEMP TABLE app_rows (id int)")
        conn.execute("INSERT INTO app_rows VALUES (1)")
        with pytest.raises(JobDuplicateError):
            driver.enqueue_many(
                [_job(idempotency_key="k", queue="q1"), _job(idempotency_key="k", on_conflict="error")],
                connection=conn,
            )
        # All or nothing: the batch's first job went with it, the caller's row did not.
        assert conn.execute("SELECT count(*) FROM x_jobs").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM app_rows").fetchone() == (1,)
        conn.commit()


def test_transactional_enqueue_on_an_autocommit_connection_commits_at_once(
    make_driver: Callable[..., PostgresDriver], migrated: str
) -> None:
    driver = make_driver()
    with psycopg.connect(migrated, autocommit=True) as conn:
        results = driver.enqueue_many([_job(), _job()], connection=conn)
    assert all(driver.introspect.get(result.id) is not None for result in results)


def test_transactional_enqueue_through_sqlalchemy(make_driver: Callable[..., PostgresDriver], migrated: str) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    driver = make_driver()
    engine = sqlalchemy.create_engine(migrated.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("CREATE TEMP TABLE orders (id int)"))
            conn.commit()

            conn.execute(sqlalchemy.text("INSERT INTO orders VALUES (1)"))
            rolled_back = driver.enqueue(_job(), connection=conn)
            conn.rollback()
            assert driver.introspect.get(rolled_back.id) is None
            assert conn.execute(sqlalchemy.text("SELECT count(*) FROM orders")).scalar() == 0

            # The job first, before any statement of the caller's: it still joins their transaction.
            committed = driver.enqueue(_job(), connection=conn)
            conn.execute(sqlalchemy.text("INSERT INTO orders VALUES (2)"))
            assert driver.introspect.get(committed.id) is None
            conn.commit()
            assert driver.introspect.get(committed.id) is not None

        with pytest.raises(RuntimeError), engine.begin() as conn:
            inside = driver.enqueue(_job(), connection=conn)
            raise RuntimeError("the app's work failed")
        assert driver.introspect.get(inside.id) is None
    finally:
        engine.dispose()


def test_other_connection_types_are_refused_with_a_hint(make_driver: Callable[..., PostgresDriver]) -> None:
    driver = make_driver()
    conn = sqlite3.connect(":memory:")
    try:
        with pytest.raises(DriverError) as caught:
            driver.enqueue(_job(), connection=conn)
    finally:
        conn.close()
    assert caught.value.code == "X_DRIVER_CONNECTION"
    assert "psycopg" in caught.value.hint


def test_eight_concurrent_claimers_never_share_a_job(make_driver: Callable[..., PostgresDriver]) -> None:
    driver = make_driver(max_size=10)
    total = 400
    driver.enqueue_many([_job() for _ in range(total)])
    claimed: list[list[str]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def claimer(index: int) -> None:
        try:
            barrier.wait()
            while True:
                got = driver.claim(ClaimRequest(worker_id=f"w{index}", limit=3))
                if not got:
                    return
                claimed[index].extend(item.job.id for item in got)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    every = [job_id for ids in claimed for job_id in ids]
    assert len(every) == len(set(every)) == total
    assert sum(1 for ids in claimed if ids) > 1, "one claimer took everything: no concurrency was tested"


def test_claim_uses_the_claim_index_on_100k_rows(make_driver: Callable[..., PostgresDriver], migrated: str) -> None:
    driver = make_driver()
    now = to_datetime(system_clock.now())  # the driver's clock too: the rows are runnable now
    with psycopg.connect(migrated, autocommit=True) as conn:
        # 100,000 rows as a live system has them: mostly finished, a backlog on two queues.
        conn.execute(
            """
            INSERT INTO x_jobs (id, run_id, name, queue, payload, state, priority, run_at, created_at,
                                updated_at, finished_at)
            SELECT 'j' || lpad(i::text, 6, '0'), 'r' || i, 'task',
                   CASE WHEN i %% 5 = 0 THEN 'other' ELSE 'default' END, '{}'::jsonb,
                   CASE WHEN i <= 60000 THEN 'done' ELSE 'ready' END, i %% 3,
                   %(now)s - make_interval(secs => i), %(now)s, %(now)s,
                   CASE WHEN i <= 60000 THEN %(now)s END
            FROM generate_series(1, 100000) AS i
            """,
            {"now": now},
        )
        conn.execute("ANALYZE x_jobs")
        params = {"now": now, "visible_at": now, "limit": 10, "worker": "w", "names": ["task"], "queue": "default"}
        plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + QUERIES["claim_queue"], params))
        print(f"\nEXPLAIN claim_queue on 100,000 rows:\n{plan}")
        assert "x_jobs_claim_idx" in plan
        assert "Seq Scan on x_jobs" not in plan

        any_plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + QUERIES["claim_any"], params))
        print(f"\nEXPLAIN claim_any on 100,000 rows:\n{any_plan}")
        assert "x_jobs_claim_any_idx" in any_plan
        assert "Seq Scan on x_jobs" not in any_plan

    # And the statement planned is the one that runs: highest priority first, then oldest run_at.
    got = driver.claim(ClaimRequest(worker_id="w", limit=3, queues=("default",)))
    assert [item.job.priority for item in got] == [2, 2, 2]
    assert [item.job.run_at for item in got] == sorted(item.job.run_at for item in got)


def test_the_pool_recovers_when_its_connections_are_killed(
    make_driver: Callable[..., PostgresDriver], migrated: str, admin_url: str
) -> None:
    app_name = f"x_unit_{uuid.uuid4().hex[:8]}"
    driver = make_driver(url=_with_params(migrated, application_name=app_name), min_size=2, max_size=2)
    first = driver.enqueue(_job())
    with psycopg.connect(admin_url, autocommit=True) as conn:
        killed = conn.execute(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s) AS t",
            [app_name],
        ).fetchone()
    assert killed is not None and killed[0] >= 1
    # The first statement after the kill meets a dead connection and is retried on a fresh one,
    # transactions included.
    batch = driver.enqueue_many([_job(), _job()])
    assert driver.introspect.get(first.id) is not None
    assert all(driver.introspect.get(item.id) is not None for item in batch)
    lease = driver.leases.acquire("k", "me", 1, 30)
    assert lease is not None and lease.slot == 0


def test_prune_deletes_in_chunks_with_their_runs_steps_and_keeps_the_live_jobs(
    make_driver: Callable[..., PostgresDriver], migrated: str
) -> None:
    clock = ManualClock()
    driver = make_driver(clock=clock)
    then = to_datetime(clock.now())
    with psycopg.connect(migrated, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO x_jobs (id, run_id, name, queue, state, run_at, created_at, updated_at, finished_at)
            SELECT 'p' || i, 'r' || i, 'task', 'default', 'done', %(t)s, %(t)s, %(t)s, %(t)s
            FROM generate_series(1, 2500) AS i
            """,
            {"t": then},
        )
        conn.execute(
            "INSERT INTO x_jobs (id, run_id, name, queue, state, run_at, created_at, updated_at)"
            " VALUES ('live', 'live-run', 'task', 'default', 'ready', %(t)s, %(t)s, %(t)s)",
            {"t": then},
        )
        conn.execute(
            "INSERT INTO x_job_steps (run_id, name, result, created_at)"
            " VALUES ('live-run', 's', 'true', %(t)s), ('r2', 's', 'true', %(t)s), ('r2500', 's', 'true', %(t)s)",
            {"t": then},
        )
    clock.advance(60)
    assert driver.prune(30) == 2500  # more than one chunk
    assert driver.introspect.get("live") is not None
    assert set(driver.steps.load("live-run")) == {"s"}
    assert driver.steps.load("r2") == {}
    assert driver.steps.load("r2500") == {}


def test_enqueue_dedupes_against_a_live_row_and_errors_on_request(make_driver: Callable[..., PostgresDriver]) -> None:
    driver = make_driver()
    first = driver.enqueue(_job(idempotency_key="k"))
    again = driver.enqueue(_job(idempotency_key="k"))
    assert (again.id, again.deduped) == (first.id, True)
    with pytest.raises(JobDuplicateError) as caught:
        driver.enqueue(_job(idempotency_key="k", on_conflict="error"))
    assert caught.value.existing_id == first.id


def test_concurrent_enqueues_of_one_key_make_one_job(make_driver: Callable[..., PostgresDriver]) -> None:
    # Each loser's INSERT waits on the winner's uncommitted row, then must still find it although
    # it committed after the loser's statement began: the enqueue re-reads instead of failing.
    driver = make_driver(max_size=8)
    barrier = threading.Barrier(8)
    results: list[Any] = []

    def enqueue() -> None:
        barrier.wait()
        results.append(driver.enqueue(_job(idempotency_key="same")))

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 8
    assert len({result.id for result in results}) == 1
    assert sorted(result.deduped for result in results) == [False] + [True] * 7


def test_is_a_job_driver(make_driver: Callable[..., PostgresDriver], migrated: str) -> None:
    driver = make_driver()
    assert isinstance(driver, JobDriver)
    assert (driver.name, driver.url) == ("postgres", migrated)
    assert driver.supports_listen_notify and driver.supports_transactional_enqueue


def test_a_closed_driver_says_so(make_driver: Callable[..., PostgresDriver]) -> None:
    driver = make_driver()
    driver.close()
    driver.close()  # idempotent
    with pytest.raises(DriverError) as caught:
        driver.introspect.get("x")
    assert caught.value.code == "X_DRIVER_CLOSED"


def test_without_an_injected_clock_the_driver_follows_the_servers(
    make_driver: Callable[..., PostgresDriver], migrated: str
) -> None:
    from ultimat3.core.clock import ReferenceClock

    driver = make_driver()
    assert isinstance(driver.clock, ReferenceClock)
    offset = driver.clock_offset()
    assert offset is not None and abs(offset) < 1.0  # one host: server and client share a clock
    with psycopg.connect(migrated, autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None and abs(driver.clock.now() - row[0]) < 0.5
    # Rows are stamped with it: a claim's visibility is the server's time plus the timeout.
    driver.enqueue(EnqueueRequest(name="task", payload={}))
    claimed = driver.claim(ClaimRequest(worker_id="w", limit=1, visibility_timeout=30))
    with psycopg.connect(migrated, autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch FROM visible_at - clock_timestamp())::float8 FROM x_jobs"
                           " WHERE id = %s", (claimed[0].job.id,)).fetchone()
    assert row is not None and 29.0 < row[0] <= 30.0
    thread = driver._reference._thread if driver._reference is not None else None
    driver.close()
    assert thread is None or not thread.is_alive()


def test_an_injected_clock_is_used_as_it_is(make_driver: Callable[..., PostgresDriver]) -> None:
    clock = ManualClock()
    driver = make_driver(clock=clock)
    assert driver.clock is clock and driver.clock_offset() is None


def test_after_a_server_restart_nobody_is_rescued_until_sessions_settle(
    make_driver: Callable[..., PostgresDriver], migrated: str
) -> None:
    from ultimat3.drivers.protocol import WorkerInfo

    a, b = make_driver(), make_driver()
    b.workers.settle = 0.5
    a.workers.register(WorkerInfo(id="A", host="h", pid=1, concurrency=1))
    b.workers.register(WorkerInfo(id="B", host="h", pid=2, concurrency=1))
    a.enqueue(EnqueueRequest(name="task", payload={}))
    [held] = a.claim(ClaimRequest(worker_id="A"))
    time.sleep(0.6)  # B's session is older than the settling time

    # A restart, as the sessions see it: every liveness session dies at once, every key is free.
    with psycopg.connect(migrated, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE application_name IN ('ultimat3 worker A', 'ultimat3 worker B')")
    # Judged from B's own (dead) session: an error, never "A is dead".
    with pytest.raises(DriverError) as caught:
        b.workers.rescue("B")
    assert caught.value.code == "X_DATABASE_UNREACHABLE"
    assert b.workers.beat("B") is False  # reconnected, key and row taken again
    assert b.workers.rescue("B") == []  # a young session judges nobody, though A's key is free
    assert a.workers.beat("A") is False  # A is back within its next beat
    time.sleep(0.6)
    assert b.workers.rescue("B") == []  # settled, and A holds its key: alive
    job = a.introspect.get(held.job.id)
    assert job is not None and job.state == "running" and a.heartbeat(held.job.id, held.claim_token, 30)

    a.workers.abandon("A")  # a real death is still found, as soon as the server has let it go
    # The client's close is asynchronous to the server: A's backend holds its lock until it exits.
    deadline = time.monotonic() + 5.0
    rescued = b.workers.rescue("B")
    while not rescued and time.monotonic() < deadline:
        time.sleep(0.02)
        rescued = b.workers.rescue("B")
    assert [r.worker_id for r in rescued] == ["A"]


def test_statements_are_prepared_once_sessions_are_proven_real_even_without_a_listener(
    make_driver: Callable[..., PostgresDriver],
) -> None:
    # An enqueue-only process never subscribes: the driver's one-shot probe (a NOTIFY from a pooled
    # session heard on a session of its own) proves the URL gives real sessions all the same.
    driver = make_driver()
    deadline = time.monotonic() + 5.0
    while not driver._db.prepared and time.monotonic() < deadline:
        time.sleep(0.01)
    assert driver._db.prepared and driver.listener is None
    driver.enqueue(EnqueueRequest(name="task", payload={}))
    assert driver._db.run(lambda conn, _: conn.prepare_threshold) is not None
    # A listener started later proves the same, and keeps saying so.
    driver.subscribe(lambda queue: None)
    assert driver.listener is not None and driver.listener.wait_probed(5.0) is True
    assert driver._db.prepared and driver.wakeups() == "notify"


def test_the_oldest_open_snapshot_is_named_and_the_worker_warns_about_it(
    make_driver: Callable[..., PostgresDriver], migrated: str, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio
    import logging

    from ultimat3.jobs import Worker

    driver = make_driver()
    name = f"x-report-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(migrated, application_name=name) as reader:
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM x_jobs").fetchone()  # the snapshot is taken here
        pid = reader.info.backend_pid
        time.sleep(0.2)
        holder = driver.oldest_snapshot()
        assert holder is not None and holder.kind == "backend" and holder.age >= 0.2
        if holder.pid == pid:  # another test's transaction could be older; ours is the one to name here
            assert (holder.application_name, holder.state) == (name, "idle in transaction")
            assert f"backend pid {pid}" in holder.describe()
            assert "idle_in_transaction_session_timeout" in holder.describe()

        worker = Worker(driver, environment="test", liveness_interval=None, schedules=False, horizon_warning=0.1)

        async def watch() -> None:
            task = asyncio.ensure_future(worker._watch_horizon(0.1))
            for _ in range(100):
                if "X_DB_HORIZON_PINNED" in caplog.text:
                    break
                await asyncio.sleep(0.02)
            task.cancel()

        with caplog.at_level(logging.WARNING, logger="ultimat3.worker"):
            asyncio.run(watch())
        worker.close()
        assert "X_DB_HORIZON_PINNED" in caplog.text and "has held the oldest open snapshot" in caplog.text
        reader.rollback()
    after = driver.oldest_snapshot()
    assert after is None or after.pid != pid


def test_claims_walk_the_claim_index_when_every_job_sits_in_one_queue(
    make_driver: Callable[..., PostgresDriver], migrated: str
) -> None:
    # The paused-queue filter once turned this plan into a seq scan and a sort of the whole table
    # (x10 per claim): the planner read `queue <> ALL(...)` as likely to exclude the one queue.
    from datetime import UTC, datetime

    driver = make_driver()
    for start in range(0, 5000, 1000):
        driver.enqueue_many([EnqueueRequest(name="plan.job", payload={"i": i}) for i in range(start, start + 1000)])
    now = datetime.now(UTC)
    params = {"now": now, "names": ["plan.job"], "limit": 1, "worker": "w", "visible_at": now, "queue": "default",
              "queues": ["default"]}
    with psycopg.connect(migrated, autocommit=True) as conn:
        conn.execute("ANALYZE x_jobs")
        for name in ("claim_any", "claim_queue", "claim_queues"):
            with conn.transaction(force_rollback=True):
                plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + QUERIES[name], params).fetchall())
            assert "Seq Scan on x_jobs" not in plan, f"{name} scans the whole table:\n{plan}"


# -- a pinned horizon and the claim cursor (issue 22) -------------------------------------------


def _buffers(conn: psycopg.Connection[Any], sql_text: str, params: dict[str, Any]) -> int:
    """Shared buffers hit + read by one execution of a statement, rolled back."""
    with conn.transaction(force_rollback=True), psycopg.ClientCursor(conn) as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql_text, params)
        row = cur.fetchone()
        assert row is not None
        plan = row[0][0]["Plan"]
        return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


def test_hot_statements_do_not_walk_what_a_pinned_horizon_keeps(
    make_driver: Callable[..., PostgresDriver], migrated: str
) -> None:
    from datetime import timedelta

    from ultimat3.drivers.protocol import Ack

    driver = make_driver()
    pin = psycopg.connect(migrated)
    try:
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT count(*) FROM x_jobs").fetchone()  # the horizon stays here from now on
        for _ in range(4):
            driver.enqueue_many([_job("pin.job") for _ in range(1000)])
            while batch := driver.claim(ClaimRequest("w", limit=100, queues=("default",))):
                driver.ack_many([Ack(c.job.id, c.claim_token, None) for c in batch])
        driver.enqueue_many([_job("pin.job") for _ in range(20)])
        running = driver.claim(ClaimRequest("w", limit=10, queues=("default",)))
        first = min(running, key=lambda c: (c.job.run_at, c.job.id)).job
        now = to_datetime(system_clock.now())
        with psycopg.connect(migrated, autocommit=True) as conn:
            base = {"now": now, "visible_at": now + timedelta(seconds=30), "limit": 10, "worker": "x",
                    "names": None, "queue": "default"}
            head = _buffers(conn, QUERIES["claim_queue"], base)
            cursor = _buffers(conn, QUERIES["claim_queue_from"], {
                **base, "c_priority": 0, "c_run_at": first.run_at, "c_id": first.id})
            one = {"id": running[0].job.id, "token": running[0].claim_token, "now": now}
            acks, _ = driver._ack_params([Ack(c.job.id, c.claim_token, None) for c in running])
            assert acks is not None
            settle = _buffers(conn, QUERIES["ack_many"], {**acks, "now": now, "channel": "x_unheard"})
            beat = _buffers(conn, QUERIES["heartbeat"], {**one, "visible_at": now + timedelta(seconds=30)})
            lapsed = _buffers(conn, QUERIES["claim_lapsed"], {
                **base, "queues": None, "now": now + timedelta(hours=1), "floor": now + timedelta(hours=1, seconds=-2)})
    finally:
        pin.close()
    # 4,000 jobs went by under the pin: the walk from the head steps over an entry for each (with
    # time-ordered ids their dead entries and row versions sit densely, a few hundred buffers for
    # the 4,000; with random ids they were spread over thousands) ...
    assert head > 2 * cursor and head > 350, (head, cursor)
    # ... the claim from its cursor, the settlement by primary key and the floored lapse search do not.
    assert cursor < 300, cursor  # the bounds: a claim of 10 and a settlement of 10 under 300
    assert settle < 300, settle
    assert beat < 30, beat
    assert lapsed < 50, lapsed


def test_a_row_skipped_while_locked_is_claimed_once_released(make_driver: Callable[..., PostgresDriver],
                                                             migrated: str) -> None:
    from ultimat3.drivers.postgres.cursors import STUCK

    clock = ManualClock(system_clock.now())
    driver = make_driver(clock=clock)
    jobs = []
    for _ in range(5):
        jobs.append(driver.enqueue(_job()).id)
        clock.advance(0.001)
    assert [c.job.id for c in driver.claim(ClaimRequest("w", visibility_timeout=300))] == jobs[:1]
    holder = psycopg.connect(migrated)
    try:
        holder.execute("SELECT 1 FROM x_jobs WHERE id = %s FOR UPDATE", (jobs[1],))
        assert [c.job.id for c in driver.claim(ClaimRequest("w", visibility_timeout=300))] == jobs[2:3]
        holder.rollback()  # released unchanged: the next claim looks at it again
        assert [c.job.id for c in driver.claim(ClaimRequest("w", visibility_timeout=300))] == jobs[1:2]
        # Held for longer than STUCK: the cursor passes it, and claims look it up by key.
        holder.execute("SELECT 1 FROM x_jobs WHERE id = %s FOR UPDATE", (jobs[3],))
        assert [c.job.id for c in driver.claim(ClaimRequest("w", visibility_timeout=300))] == jobs[4:5]
        clock.advance(STUCK)
        assert driver.claim(ClaimRequest("w", visibility_timeout=300)) == []
        holder.rollback()
        assert [c.job.id for c in driver.claim(ClaimRequest("w", visibility_timeout=300))] == jobs[3:4]
    finally:
        holder.close()


def test_a_late_commit_from_another_process_is_claimed_at_the_next_claim(
    make_driver: Callable[..., PostgresDriver], migrated: str
) -> None:
    claimer = make_driver()
    seen = Seen()
    claimer.subscribe(seen)
    producer = make_driver()
    with psycopg.connect(migrated) as conn:
        late = producer.enqueue(_job(), connection=conn).id  # the earliest run_at, committed last
        early, later = producer.enqueue(_job()).id, producer.enqueue(_job()).id
        assert [c.job.id for c in claimer.claim(ClaimRequest("w", visibility_timeout=300))] == [early]
        assert [c.job.id for c in claimer.claim(ClaimRequest("w", visibility_timeout=300))] == [later]
        seen.queues.clear()
        conn.commit()
    assert seen.wait_for("default", 5.0)  # its NOTIFY carries (priority, run_at): the cursor goes back
    assert [c.job.id for c in claimer.claim(ClaimRequest("w", visibility_timeout=300))] == [late]


def test_a_one_queue_claim_never_walks_another_queues_backlog(make_driver: Callable[..., PostgresDriver],
                                                              migrated: str) -> None:
    # A backlog at a higher priority in another queue: the one-queue claim's higher-priority range
    # must walk x_jobs_claim_idx from its own queue, not x_jobs_claim_any_idx filtered by queue.
    driver = make_driver()
    for start in range(0, 20_000, 5_000):
        driver.enqueue_many([_job("cold.job", queue="cold", priority=5) for _ in range(start, start + 5_000)])
    driver.enqueue_many([_job("hot.job", queue="hot") for _ in range(10)])
    with psycopg.connect(migrated, autocommit=True) as conn:
        conn.execute("ANALYZE x_jobs")
        first = conn.execute("SELECT priority, run_at, id FROM x_jobs WHERE queue = 'hot' "
                             "ORDER BY priority DESC, run_at, id LIMIT 1").fetchone()
        assert first is not None
        now = to_datetime(system_clock.now())
        params = {"now": now, "visible_at": now, "limit": 10, "worker": "x", "names": None, "queue": "hot",
                  "c_priority": first[0], "c_run_at": first[1], "c_id": first[2]}
        for name in ("claim_queue", "claim_queue_from"):
            assert _buffers(conn, QUERIES[name], params) < 300, name
            with conn.transaction(force_rollback=True):
                plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + QUERIES[name], params).fetchall())
            assert "x_jobs_claim_any_idx" not in plan, f"{name} walks the all-queues index:\n{plan}"


def test_a_prepared_claim_runs_its_cached_plan_instead_of_being_planned_each_time(
    make_driver: Callable[..., PostgresDriver],
) -> None:
    from ultimat3.drivers.protocol import Ack

    # One pooled connection, so every claim below runs in the session inspected afterwards.
    driver = make_driver(max_size=1)
    # A direct connection gives real sessions; the background probe would find the same, later.
    driver._db.prepared = True
    driver.enqueue_many([_job("plan.job") for _ in range(40)])
    for _ in range(12):  # past psycopg's prepare threshold, like a worker's claim loop
        batch = driver.claim(ClaimRequest("w", limit=2, queues=("default",)))
        assert batch
        assert all(driver.ack_many([Ack(c.job.id, c.claim_token, None) for c in batch]))
    plans = driver._db.run(lambda conn, _: conn.execute(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
        " WHERE statement LIKE '%SKIP LOCKED%'").fetchall())
    # The claim was prepared, and each execution used the cached generic plan: on a grown table
    # auto mode preferred a plan per execution, ~1 ms of planning per claim (claim_growth.py).
    assert plans, "the claim was never prepared"
    assert sum(generic for generic, _ in plans) >= 6, plans
    assert all(custom == 0 for _, custom in plans), plans


def test_a_pipelined_ack_and_claim_runs_the_claims_cached_plan(make_driver: Callable[..., PostgresDriver]) -> None:
    # The worker's own path: acks, the plan choice and the claim in one pipeline with no BEGIN.
    driver = make_driver(max_size=1)
    driver._db.prepared = True
    driver.enqueue_many([_job("plan.job") for _ in range(40)])
    request = ClaimRequest("w", limit=2, queues=("default",))
    batch = driver.claim(request)
    for _ in range(12):
        settled, batch = driver.ack_and_claim([Ack(c.job.id, c.claim_token, None) for c in batch], request)
        assert all(settled) and batch
    plans = driver._db.run(lambda conn, _: conn.execute(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
        " WHERE statement LIKE '%SKIP LOCKED%'").fetchall())
    assert plans and sum(generic for generic, _ in plans) >= 6, plans
    assert all(custom == 0 for _, custom in plans), plans
    # set_config(..., true) lasted only for its transaction: the session is back to auto.
    mode = driver._db.run(lambda conn, _: conn.execute("SHOW plan_cache_mode").fetchone())
    assert mode == ("auto",)


def test_a_pipelined_ack_and_claim_is_one_transaction(make_driver: Callable[..., PostgresDriver],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # No BEGIN is sent: what makes the acks and the claim all-or-nothing is the pipeline's one
    # implicit transaction. A claim that fails must take the acks sent before it down with it.
    from ultimat3.drivers.postgres import driver as postgres_driver

    driver = make_driver(max_size=1)
    driver._db.prepared = True
    first = driver.enqueue(_job("atomic.job")).id
    driver.enqueue(_job("atomic.job"))
    (claimed,) = driver.claim(ClaimRequest("w", visibility_timeout=300))
    assert claimed.job.id == first
    real = postgres_driver._ClaimPlan.run_single

    def failing(self: Any, cur: Any) -> Any:
        real(self, cur)
        return cur.execute("SELECT 1 / 0")  # after the claim, in the same pipeline

    monkeypatch.setattr(postgres_driver._ClaimPlan, "run_single", failing)
    with pytest.raises(psycopg.errors.DivisionByZero):
        driver.ack_and_claim([Ack(claimed.job.id, claimed.claim_token, None)], ClaimRequest("w"))
    monkeypatch.undo()
    row = driver.introspect.get(first)
    assert row is not None and row.state == "running"  # the ack was rolled back with the claim
    assert [r.state for r in driver.introspect.list(JobFilter(name="atomic.job"))].count("ready") == 1  # unclaimed
    assert driver.ack_many([Ack(claimed.job.id, claimed.claim_token, None)]) == [True]


def test_times_read_as_utc_whatever_zone_the_session_starts_in(
    make_driver: Callable[..., PostgresDriver], admin_url: str, schema: str
) -> None:
    from datetime import UTC

    from ultimat3.drivers.postgres.rows import _utc

    # Sessions that start in another zone, as on a server whose TimeZone is set to one.
    # (By hand: libpq reads "%20" as a space in a URI, and urlencode would write "+".)
    options = f"options=-csearch_path%3D{schema}%20-cTimeZone%3DAsia/Kolkata"
    kolkata = f"{admin_url}{'&' if '?' in admin_url else '?'}{options}"
    driver = make_driver(url=kolkata)
    with driver._pool.connection() as conn:
        # The driver's own sessions switch to UTC, so psycopg decodes straight to UTC datetimes.
        assert conn.info.parameter_status("TimeZone") == "UTC"
        raw = conn.execute("SELECT now()").fetchone()
    assert raw is not None and raw[0].tzinfo is UTC
    job_id = driver.enqueue(_job(queue="tz")).id
    claimed = driver.claim(ClaimRequest(worker_id="w", limit=1, queues=("tz",)))
    assert [c.job.id for c in claimed] == [job_id]
    record = claimed[0].job
    for value in (record.created_at, record.run_at, record.updated_at, record.visible_at, record.started_at):
        assert value is not None and value.tzinfo is UTC
    # A caller's session (a transactional enqueue, a backfill's connection) keeps its zone: its
    # values are converted, the same instant.
    with psycopg.connect(kolkata, autocommit=True) as caller:
        value = caller.execute("SELECT now()").fetchone()
        assert value is not None and value[0].tzinfo is not UTC
        assert _utc(value[0]) == value[0] and _utc(value[0]).tzinfo is UTC
