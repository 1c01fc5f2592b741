"""The worker: claims jobs, runs them with bounded concurrency, heartbeats, settles, stops gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import random
import signal as os_signal
import socket
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from ultimat3.core.context import Environment, default_environment
from ultimat3.core.errors import check, first_line
from ultimat3.core.throttle import ThrottledLog
from ultimat3.drivers.errors import DriverError
from ultimat3.drivers.fair import check_weights
from ultimat3.drivers.protocol import (
    Ack,
    ClaimedJob,
    ClaimRequest,
    JobDriver,
    JobRecord,
    NackRequest,
    WaitingName,
    WorkerInfo,
)
from ultimat3.jobs.execute import SHUTDOWN, AttemptRunner, Outcome
from ultimat3.jobs.job import get_job, registered_jobs
from ultimat3.jobs.prefetch import Prefetch
from ultimat3.jobs.schedule import tick_text
from ultimat3.jobs.scheduler import Scheduler, declared_schedules
from ultimat3.jobs.signal import AbortSignal

log = logging.getLogger("ultimat3.worker")
_throttled = ThrottledLog(log)
# Once a minute, however many workers of this process see the same pinned snapshot.
_horizon_log = ThrottledLog(log, 60.0)
#: At most this many acks share one commit.
MAX_ACK_BATCH = 100
#: Poll interval while a driver that should be woken by NOTIFY is not (a transaction-mode pooler).
POLL_FLOOR = 0.25
#: A worker that fires schedules looks at them at least this often (seconds), tick or not.
SCHEDULE_RECHECK = 5.0
#: How often a worker looks for a transaction pinning the database's oldest snapshot (seconds).
HORIZON_CHECK = 15.0
#: Mean seconds between two retention passes of a worker with ``prune_after`` (jittered +-50%).
PRUNE_INTERVAL = 300.0
T = TypeVar("T")


#: What a worker event reports: a claim batch, how one attempt settled ("fenced": the write was
#: refused because the attempt no longer held its claim), a job this worker rescued from a dead one, or
#: a schedule's tick this worker fired ("scheduled", with the enqueued job's id).
WorkerEventKind = Literal["claimed", "done", "retry", "dead", "suspended", "aborted", "released", "fenced",
                          "rescued", "scheduled"]


@dataclass(frozen=True)
class WorkerEvent:
    """What a metrics hook receives: one per claim batch and one per settled attempt."""

    kind: WorkerEventKind
    worker_id: str
    job_id: str | None = None
    name: str | None = None
    attempt: int | None = None
    duration: float | None = None
    error: str | None = None
    count: int = 1
    #: The queue of the attempt's job (settled attempts).
    queue: str | None = None


if sys.version_info >= (3, 12):
    def _attempt_task(attempt: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """The attempt's task, started eagerly: it runs inside the call up to its first real wait
        (for a handler that does not block, its ack), one turn of the loop sooner and with no
        handle scheduled for its first step."""
        return asyncio.Task(attempt, loop=asyncio.get_running_loop(), eager_start=True)
else:
    def _attempt_task(attempt: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """The attempt's task (the loop's own create_task: ensure_future's checks buy nothing)."""
        return asyncio.get_running_loop().create_task(attempt)


@dataclass
class _Active:
    claimed: ClaimedJob
    signal: AbortSignal
    task: asyncio.Task[None] | None = None
    started: float = field(default_factory=time.monotonic)


def _age(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:g}d"
    return f"{seconds / 3600:g}h" if seconds >= 3600 else f"{seconds:g}s"


class Worker:
    """Runs declared jobs from one driver.

    ``await worker.run()`` works until :meth:`stop`; :meth:`drain` runs until nothing is
    runnable (tests, foreground runs). Async handlers run on the loop, sync ones in a thread
    pool of ``concurrency`` threads. A claim lives ``visibility_timeout`` seconds and is renewed
    every ``heartbeat_interval``; a renewal the driver refuses (cancelled, re-claimed) aborts the
    attempt through its signal. Acks of attempts that finish together are written in one commit
    (waiting at most ``ack_delay`` seconds for company). On stop, claiming ends at once, running attempts get
    ``grace_period`` seconds, then are aborted and released without burning an attempt.

    :meth:`run` registers the worker in the driver's registry with a liveness signal the database
    or the OS keeps (see :class:`~ultimat3.drivers.protocol.WorkerRegistry`) and, every
    ``liveness_interval`` seconds (jittered), refreshes it and rescues the running jobs of workers
    whose signal is gone: a killed worker's jobs run again within about that interval instead of
    after ``visibility_timeout``. ``liveness_interval=None`` turns both off.

    ``fair=True`` claims round-robin by tenant (see :mod:`ultimat3.drivers.fair`): a tenant with a
    few jobs behind another's backlog starts them in the first claims, not after the backlog;
    ``fair={"acme": 3}`` gives acme three jobs per turn (every other tenant one).

    ``freeze_gc=True`` freezes what is alive when :meth:`run` starts out of the cyclic garbage
    collector's scans (see :attr:`freeze_gc`); for a process that runs the worker and little else.
    """

    def __init__(
        self,
        driver: JobDriver,
        *,
        queues: Sequence[str] | None = None,
        names: Sequence[str] | None = None,
        concurrency: int = 10,
        visibility_timeout: float = 30.0,
        heartbeat_interval: float | None = None,
        poll_interval: float = 1.0,
        grace_period: float = 30.0,
        worker_id: str | None = None,
        environment: Environment | None = None,
        on_event: Callable[[WorkerEvent], None] | None = None,
        rand: Callable[[], float] = random.random,
        ack_delay: float = 0.002,
        unknown_names_interval: float = 300.0,
        liveness_interval: float | None = 1.0,
        schedules: bool = True,
        horizon_warning: float | None = 60.0,
        prune_after: float | None = None,
        fair: bool | Mapping[str, int] = False,
        prefetch: int | None = None,
        freeze_gc: bool = False,
    ) -> None:
        check(
            isinstance(concurrency, int) and concurrency >= 1,
            f"Worker(concurrency={concurrency!r}) — concurrency is a whole number, at least 1",
            "write Worker(driver, concurrency=10)",
            code="X_WORKER_CONCURRENCY",
        )
        check(
            visibility_timeout > 0 and poll_interval > 0 and grace_period >= 0 and ack_delay >= 0,
            f"Worker(visibility_timeout={visibility_timeout!r}, poll_interval={poll_interval!r}, "
            f"grace_period={grace_period!r}, ack_delay={ack_delay!r}) — intervals must be positive",
            "write e.g. visibility_timeout=30, poll_interval=1, grace_period=30",
            code="X_WORKER_CONFIG",
        )
        self.driver = driver
        self.queues = tuple(queues) if queues else None
        self._names = tuple(names) if names else None
        self.concurrency = concurrency
        self.visibility_timeout = visibility_timeout
        self.heartbeat_interval = heartbeat_interval or visibility_timeout / 3
        check(
            self.heartbeat_interval < visibility_timeout,
            f"Worker(heartbeat_interval={self.heartbeat_interval!r}) is not shorter than "
            f"visibility_timeout={visibility_timeout!r}: claims would lapse between renewals",
            "make heartbeat_interval at most a third of visibility_timeout",
            code="X_WORKER_CONFIG",
        )
        check(
            liveness_interval is None or liveness_interval > 0,
            f"Worker(liveness_interval={liveness_interval!r}) — the probe interval must be positive",
            "write liveness_interval=1 (seconds), or None to turn the registry and rescue off",
            code="X_WORKER_CONFIG",
        )
        check(
            prune_after is None or prune_after > 0,
            f"Worker(prune_after={prune_after!r}) — the retention must be a positive number of seconds",
            "write prune_after=7 * 86400 (finished jobs older than a week go), or None to keep them",
            code="X_WORKER_CONFIG",
        )
        check(
            prefetch is None or (isinstance(prefetch, int) and not isinstance(prefetch, bool) and prefetch >= 0),
            f"Worker(prefetch={prefetch!r}) — prefetch is a whole number of jobs, 0 or more",
            "write prefetch=0 (claim only for free slots), prefetch=N (exactly N) or leave it out "
            "(adaptive: from concurrency up, while handlers are quick next to a claim's round trip)",
            code="X_WORKER_CONFIG",
        )
        #: Jobs claimed ahead of a free slot (plain claims only: never jobs under flow control or
        #: fair dispatch), started the moment a handler returns instead of after a round trip.
        #: ``None``: adaptive (see :class:`~ultimat3.jobs.prefetch.Prefetch`), at least ``concurrency``.
        self.prefetch = prefetch
        #: Call :func:`gc.freeze` when :meth:`run` starts. What is alive then (imports, the app's
        #: setup) is never scanned by the cyclic collector again; with the full collections it
        #: saves (tens of ms each, every few hundred attempts), it cut ~7 us per job at c=10 on
        #: the bench. Those objects are then freed by reference counting only, as after an app's
        #: own ``gc.freeze()``. ``x worker`` sets it: it owns its process.
        self.freeze_gc = freeze_gc
        self._prefetch = Prefetch(concurrency) if prefetch is None else Prefetch.fixed(prefetch)
        self.liveness_interval = liveness_interval
        #: Finished jobs older than this many seconds are deleted by this worker every
        #: PRUNE_INTERVAL (jittered); ``None``: never (``x db prune`` by hand or from cron).
        self.prune_after = prune_after
        #: Serve tenants in turn rather than in one claim order (``ClaimRequest.fair``), with these
        #: jobs per turn by tenant (``None``: one each).
        self.fair = isinstance(fair, Mapping) or bool(fair)
        self.weights: dict[str, int] | None = dict(fair) if isinstance(fair, Mapping) else None
        check_weights(self.weights)
        #: Whether this worker fires the schedules of the jobs it runs (every worker may: each tick
        #: fires once whichever gets there first).
        self.fire_schedules = schedules
        #: Warn (``X_DB_HORIZON_PINNED``, at most once a minute) when a transaction has held the
        #: database's oldest snapshot longer than this many seconds (PostgreSQL); ``None``: never.
        self.horizon_warning = horizon_warning
        self._rand = rand
        self._registered = False
        self.poll_interval = poll_interval
        # When the next rate-limit token a claim was refused comes (driver clock), and whether the
        # worker's names declare flow control (cached per names tuple).
        self._token_at: float | None = None
        self._governed: tuple[tuple[str, ...], bool] | None = None
        self.grace_period = grace_period
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.environment = environment or default_environment()
        self.on_event = on_event
        self._handler_pool = ThreadPoolExecutor(concurrency, thread_name_prefix="x-job")
        # Driver calls get their own threads so a pool full of busy sync handlers cannot starve
        # heartbeats (which would let claims lapse under load).
        self._io_pool = ThreadPoolExecutor(concurrency + 4, thread_name_prefix="x-io")
        self.runner = AttemptRunner(driver, environment=self.environment, handler_pool=self._handler_pool,
                                    rand=rand)
        self._active: dict[str, _Active] = {}
        # Claimed ahead, not started yet (see prefetch); heartbeated and released like the others.
        self._ahead: deque[ClaimedJob] = deque()
        # Attempts whose handler has not returned: the slots ``concurrency`` bounds.
        self._busy = 0
        #: In _fill: attempts are being started (their acks wait for the rest of the fill).
        self._filling = False
        #: An ack found every attempt waiting during a fill: written when the fill ends.
        self._flush_after_fill = False
        self.ack_delay = ack_delay
        self.unknown_names_interval = unknown_names_interval
        # Acks queued for the next batch, each with its attempt (ended when the batch is written).
        self._acks: list[tuple[Ack, _Active]] = []
        self._ack_timer: asyncio.TimerHandle | None = None
        self._ack_writes: set[asyncio.Future[None]] = set()
        self._stopping = False
        # Slots promised to claims in flight (the main loop's, or one riding with an ack batch).
        self._reserved = 0
        # Attempts whose ack rides with a claim in flight: that claim's slots (reserved) replace
        # theirs, so they are not counted twice.
        self._settling = 0
        # Whether ack batches carry the next claim (run(): yes; drain(), with its budget: no).
        self._claim_with_acks = False
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.processed = 0

    # -- plumbing -------------------------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        """The job names this worker claims: the ones passed, else every declared job."""
        return self._names or tuple(handle.name for handle in registered_jobs())

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io_pool, fn, *args)

    def _emit(self, event: WorkerEvent) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:  # a broken metrics hook must not take the worker down
                log.exception("worker on_event hook failed")

    def _notify(self, _queue: str = "*") -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or loop.is_closed():
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            wake.set()  # on the loop's own thread: no self-pipe write
        else:
            loop.call_soon_threadsafe(wake.set)

    # -- attempts -------------------------------------------------------------------------------

    def _claim_request(self, names: tuple[str, ...], limit: int) -> ClaimRequest | None:
        if not names or limit < 1:
            return None
        return ClaimRequest(worker_id=self.worker_id, limit=limit, visibility_timeout=self.visibility_timeout,
                            queues=self.queues, names=names, flow=self._governs(names), fair=self.fair,
                            weights=self.weights)

    async def _claim(self, limit: int, names: tuple[str, ...] | None = None) -> list[ClaimedJob]:
        request = self._claim_request(self.names if names is None else names, limit)
        if request is None:
            return []
        with self._reserving(limit):
            sent = time.monotonic()
            claimed = await self._io(self.driver.claim, request)
            self._prefetch.claimed(time.monotonic() - sent)
        self._took(claimed)
        return claimed

    @contextlib.contextmanager
    def _reserving(self, slots: int) -> Iterator[None]:
        """Count ``slots`` as held while a claim for them is in flight."""
        self._reserved += slots
        try:
            yield
        finally:
            self._reserved -= slots

    def _room(self, names: tuple[str, ...], settling: int = 0) -> int:
        """How many more jobs this worker may claim: slots plus prefetch, less what it holds
        (``settling``: attempts whose ack is about to commit, whose claims end with it)."""
        ahead = (0 if self._governs(names) or self.fair or not self._claim_with_acks
                 else self._prefetch.depth(time.monotonic()))
        held = len(self._active) - self._settling - settling + len(self._ahead) + self._reserved
        return self.concurrency + ahead - held

    async def _hold(self, claimed: list[ClaimedJob]) -> bool:
        """Queue claimed jobs to start as slots free; ``False`` (and each released, no attempt
        burned) when the worker was told to stop while they were being claimed."""
        if self._stopping:
            await self._release(claimed)
            return False
        self._ahead.extend(claimed)
        self._fill()
        return True

    def _fill(self) -> None:
        """Start jobs claimed ahead while a slot is free."""
        if self._filling:
            return  # called from an attempt that _start ran eagerly: the outer fill's loop goes on
        self._filling = True
        try:
            while self._ahead and self._busy < self.concurrency and not self._stopping:
                self._start(self._ahead.popleft())
        finally:
            self._filled()

    def _filled(self) -> None:
        """A fill is over: if an ack queued during it found every attempt waiting, the batch is
        written now, unless an attempt started since is still running (see :meth:`_ack`)."""
        self._filling = False
        if self._flush_after_fill:
            self._flush_after_fill = False
            if self._busy == 0:
                self._flush_acks()

    def _took(self, claimed: list[ClaimedJob]) -> None:
        # A rate limit turned a job away: come back when its bucket has a token, not at the next poll.
        self._token_at = getattr(claimed, "wake_at", None)
        if claimed and self.on_event is not None:
            self._emit(WorkerEvent("claimed", self.worker_id, count=len(claimed)))

    def _start(self, claimed: ClaimedJob) -> None:
        self._busy += 1
        active = _Active(claimed, AbortSignal(claimed.job.name))
        self._active[claimed.job.id] = active
        self._prefetch.started(active.started)
        active.task = _attempt_task(self._attempt(active))

    async def _attempt(self, active: _Active) -> None:
        claimed = active.claimed
        job = claimed.job
        outcome: Outcome
        try:
            outcome = await self.runner.run(claimed, active.signal)
        except Exception as error:  # defensive: the runner is meant never to raise
            log.exception("attempt runner failed", extra={"job_id": job.id})
            outcome = Outcome("retry", f"{type(error).__name__}: {error}", delay=1.0)
        finally:
            # The handler is over: its slot goes to a job claimed ahead while this one settles.
            self._busy -= 1
            self._prefetch.finished(active.started, time.monotonic())
            self._fill()
        if outcome.kind == "done":
            # Queued, not awaited: the batch's commit ends the attempt (_write_acks), so the task
            # ends here and nothing resumes it after the commit (on 3.12+, a handler that never
            # waits runs its whole task inside _start).
            self._ack(active, outcome.result)
            return
        try:
            settled = await self._settle(claimed, outcome)
        except Exception as error:
            self._unsettled(job, error)
            settled = False
        if settled and outcome.kind == "dead":
            await self._after_dead(claimed, outcome.error)
        self._ended(active, outcome.kind if settled or outcome.kind == "aborted" else "fenced", outcome.error)
        self._notify()

    def _unsettled(self, job: JobRecord, error: Exception) -> None:
        # The database is unreachable: the claim lapses and another worker re-runs the job.
        _throttled.warning("settle", "could not settle job %s (%s): %s; its claim will lapse and it runs "
                           "again", job.id, job.name, first_line(str(error)), job_id=job.id)

    def _ended(self, active: _Active, kind: WorkerEventKind, error: str | None) -> None:
        """An attempt is over and written (or could not be): log it, tell the listener, free it."""
        job = active.claimed.job
        duration = time.monotonic() - active.started
        self._log_attempt(active.claimed, kind, duration, error)
        if self.on_event is not None:  # the event (a frozen dataclass: ~1.2 us) only for a listener
            self._emit(WorkerEvent(kind, self.worker_id, job.id, job.name, job.attempt, duration, error,
                                   queue=job.queue))
        self.processed += 1
        self._active.pop(job.id, None)

    async def _settle(self, claimed: ClaimedJob, outcome: Outcome) -> bool:
        """How a failure, a suspension or a release is written: one nack, fenced on the claim
        token (an ack goes through :meth:`_ack`); an aborted attempt writes nothing."""
        request = outcome.nack_request()
        if request is None:
            return False
        return await self._io(self.driver.nack, claimed.job.id, claimed.claim_token, request)

    def _log_attempt(self, claimed: ClaimedJob, kind: str, duration: float, error: str | None) -> None:
        job = claimed.job
        level = logging.WARNING if kind in ("retry", "fenced") else logging.ERROR if kind == "dead" else logging.INFO
        if not log.isEnabledFor(level):
            return  # nobody listens: skip building the record's fields, once per attempt
        first = first_line(error) if kind in ("retry", "dead", "fenced", "aborted") and error else None
        log.log(
            level, "job %s %s id=%s queue=%s attempt=%d/%d %.3fs%s", job.name, kind, job.id, job.queue,
            job.attempt, job.max_attempts, duration, f" error: {first}" if first else "",
            extra={"job_id": job.id, "job_name": job.name, "queue": job.queue, "outcome": kind,
                   "attempt": job.attempt, "max_attempts": job.max_attempts, "duration": round(duration, 6),
                   "error": first, "worker_id": self.worker_id},
        )

    def _ack(self, active: _Active, result: Any) -> None:
        """Queue a successful attempt's ack; acks that finish together share one commit, and the
        attempt ends when it is written (see :meth:`_write_acks`).

        The batch is written at once when every running attempt is waiting on its ack (nothing
        else could join it; when that happens while slots are being filled, where an attempt may
        run to its ack inside the fill, once the fill is over), else after at most ``ack_delay``
        seconds.
        """
        claimed = active.claimed
        self._acks.append((Ack(claimed.job.id, claimed.claim_token, result), active))
        if len(self._acks) >= MAX_ACK_BATCH or (self._busy == 0 and not self._filling):
            self._flush_acks()
            return
        if self._busy == 0:
            self._flush_after_fill = True  # the fill under way may start attempts that join it
        if self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(self.ack_delay, self._flush_acks)

    def _flush_acks(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        batch, self._acks = self._acks, []
        if batch:
            # Held until done: the loop keeps only weak references to tasks.
            task = asyncio.ensure_future(self._write_acks(batch))
            self._ack_writes.add(task)
            task.add_done_callback(self._ack_writes.discard)

    async def _write_acks(self, batch: list[tuple[Ack, _Active]]) -> None:
        acks = [ack for ack, _ in batch]
        claimed: list[ClaimedJob] = []
        # The batch's slots free up with its commit: the same transaction claims the next jobs for
        # them (and any other free slot), so a busy worker pays one round trip and one commit per
        # batch instead of an ack's and a claim's.
        names = self.names
        limit = self._room(names, settling=len(batch))
        request = self._claim_request(names, limit) if self._claim_with_acks and not self._stopping else None
        try:
            if request is None:
                settled = await self._io(self.driver.ack_many, acks)
            else:
                with self._reserving(limit):
                    self._settling += len(batch)
                    try:
                        sent = time.monotonic()
                        settled, claimed = await self._io(self.driver.ack_and_claim, acks, request)
                        self._prefetch.claimed(time.monotonic() - sent)
                    except Exception as error:
                        # Whatever failed (most likely the claim), the acks must not wait for it.
                        _throttled.warning("claim", "claim with acks failed (%s: %s); acking alone",
                                           type(error).__name__, first_line(str(error)))
                        settled = await self._io(self.driver.ack_many, acks)
                    finally:
                        self._settling -= len(batch)
        except Exception as error:
            for _, active in batch:
                self._unsettled(active.claimed.job, error)
                self._ended(active, "fenced", None)
            self._notify()
            return
        for (_, active), ok in zip(batch, settled, strict=True):
            self._ended(active, "done" if ok else "fenced", None)
        self._notify()  # the batch's slots are free: the main loop decides whether to claim
        if not claimed:
            return
        self._took(claimed)
        await self._hold(claimed)

    async def _release(self, claimed: list[ClaimedJob]) -> None:
        release = NackRequest(counts_as_attempt=False, release=True)
        for job in claimed:
            try:
                await self._io(self.driver.nack, job.job.id, job.claim_token, release)
            except Exception as error:
                _throttled.warning("release", "could not release job %s (%s); its claim will lapse and it runs "
                                   "again", job.job.id, first_line(str(error)), job_id=job.job.id)
            self._emit(WorkerEvent("released", self.worker_id, job.job.id, job.job.name, job.job.attempt,
                                   queue=job.job.queue))

    async def _after_dead(self, claimed: ClaimedJob, error: str | None) -> None:
        handle = get_job(claimed.job.name)
        if handle is None or handle.on_dead is None:
            return
        try:
            await self._io(handle.on_dead, self.driver, claimed.job, error)
        except Exception:
            log.exception("on_dead hook of %s failed", claimed.job.name, extra={"job_id": claimed.job.id})

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            for ahead in list(self._ahead):
                # A job claimed ahead keeps its claim as a running one does; one whose claim is gone
                # (cancelled, lapsed) is dropped before it ever starts.
                if await self._renew(ahead) is False:
                    with contextlib.suppress(ValueError):
                        self._ahead.remove(ahead)
            for active in list(self._active.values()):
                if active.signal.aborted:
                    continue
                claimed = active.claimed
                if await self._renew(claimed) is False:
                    current = await self._io(self.driver.introspect.get, claimed.job.id)
                    cancelled = current is not None and current.state == "cancelled"
                    active.signal.abort("cancelled" if cancelled else "claim lost")

    async def _renew(self, claimed: ClaimedJob) -> bool | None:
        """Heartbeat one claim: whether the driver kept it, ``None`` when the call failed (retried at
        the next beat)."""
        try:
            return await self._io(self.driver.heartbeat, claimed.job.id, claimed.claim_token, self.visibility_timeout)
        except Exception as error:
            _throttled.warning("heartbeat", "heartbeat failed (%s); will retry", first_line(str(error)),
                               job_id=claimed.job.id)
            return None

    # -- liveness and rescue --------------------------------------------------------------------

    def info(self) -> WorkerInfo:
        """What this worker says of itself in the registry."""
        return WorkerInfo(id=self.worker_id, host=socket.gethostname(), pid=os.getpid(),
                          concurrency=self.concurrency, queues=self.queues)

    def _clock_offset(self) -> float | None:
        measure = getattr(self.driver, "clock_offset", None)
        return measure() if callable(measure) else None

    def wakeups(self) -> str:
        """How this worker learns of new jobs: ``notify``, ``in-process``, or ``polling (why)``."""
        report = getattr(self.driver, "wakeups", None)
        if callable(report):
            return str(report())
        if self.driver.supports_listen_notify:
            return "notify"
        if self.driver.name == "memory":
            return "in-process"
        return f"polling every {self.poll_interval:g}s (no NOTIFY on {self.driver.name})"

    def _governs(self, names: tuple[str, ...]) -> bool:
        """Whether any job this worker runs declares flow control (its claims then take such jobs)."""
        cached = self._governed
        if cached is None or cached[0] != names:
            handles = (get_job(name) for name in names)
            cached = self._governed = (names, any(h is not None and h.flow is not None for h in handles))
        return cached[1]

    def _poll_timeout(self) -> float:
        # A driver that should be woken by NOTIFY but is not: poll at the floor until it is again.
        timeout = self.poll_interval
        if self.driver.supports_listen_notify and self.wakeups().startswith("polling"):
            timeout = min(self.poll_interval, POLL_FLOOR)
        if self._token_at is not None:
            timeout = max(0.0, min(timeout, self._token_at - self.driver.clock.now()))
        return timeout

    async def _register(self) -> None:
        try:
            await self._io(self.driver.workers.register, self.info())
        except DriverError as error:
            if error.code == "X_WORKER_ID_TAKEN":
                raise  # two live processes under one id: a configuration error, not an outage
            _throttled.warning("register", "could not register worker (%s); will retry", first_line(str(error)))
            return
        except Exception as error:
            _throttled.warning("register", "could not register worker (%s); will retry", first_line(str(error)))
            return
        self._registered = True

    async def _liveness(self, interval: float) -> None:
        # Refresh our own signal and row, then look for dead workers; one probe per interval,
        # jittered so a fleet started together does not probe in lockstep.
        while True:
            await asyncio.sleep(interval * (0.8 + 0.4 * self._rand()))
            try:
                if not self._registered:
                    await self._register()
                    if not self._registered:
                        continue
                else:
                    await self._io(self.driver.workers.beat, self.worker_id, self._clock_offset(), self.wakeups())
                rescued = await self._io(self.driver.workers.rescue, self.worker_id)
            except Exception as error:
                _throttled.warning("liveness", "worker liveness probe failed (%s); will retry",
                                   first_line(str(error)))
                continue
            _throttled.recovered("liveness", "worker liveness probe works again")
            if rescued:
                dead = sorted({r.worker_id for r in rescued})
                log.warning("rescued %d running job(s) of dead worker(s) %s: they are ready again",
                            len(rescued), ", ".join(dead), extra={"count": len(rescued), "dead_workers": dead})
                for job in rescued:
                    self._emit(WorkerEvent("rescued", self.worker_id, job_id=job.job_id,
                                           error=f"worker {job.worker_id} died"))
                self._notify()

    async def _unregister(self) -> None:
        if not self._registered:
            return
        try:
            await self._io(self.driver.workers.unregister, self.worker_id)
        except Exception as error:
            log.warning("could not remove worker %s from the registry (%s); the next probe by another worker"
                        " will", self.worker_id, first_line(str(error)))
        self._registered = False

    def unknown_names(self) -> list[WaitingName]:
        """Jobs waiting in this worker's queues under names it does not declare: nothing here will
        ever run them (the module that declares them was not imported, or is another service's)."""
        known = set(self.names)
        return [
            waiting for waiting in self.driver.introspect.waiting_names()
            if waiting.name not in known and (self.queues is None or waiting.queue in self.queues)
        ]

    async def _watch_unknown_names(self) -> None:
        # At start, then every unknown_names_interval: jobs that sit there with nothing in the
        # logs to say why are the hardest kind of stuck to find.
        while True:
            try:
                for waiting in await self._io(self.unknown_names):
                    log.warning(
                        'queue %s holds %d job(s) named "%s" that this worker does not declare; they will wait '
                        "until a worker that imports their module runs (check --app / X_APP)",
                        waiting.queue, waiting.count, waiting.name,
                        extra={"queue": waiting.queue, "job_name": waiting.name, "count": waiting.count},
                    )
            except Exception as error:
                _throttled.warning("unknown-names", "could not list waiting job names (%s)", first_line(str(error)))
            await asyncio.sleep(self.unknown_names_interval)

    async def _watch_horizon(self, threshold: float) -> None:
        # A queue slows down with every job while someone holds an old snapshot (VACUUM may not
        # remove what its hot statements walk): say who, long before the backlog shows.
        measure = getattr(self.driver, "oldest_snapshot", None)
        if not callable(measure):
            return
        while True:
            try:
                holder = await self._io(measure)
            except Exception as error:
                _throttled.warning("horizon-check", "could not look for old open transactions (%s)",
                                   first_line(str(error)))
                holder = None
            if holder is not None and holder.age >= threshold:
                _horizon_log.warning("horizon", "X_DB_HORIZON_PINNED: %s (the queue slows down until it ends)",
                                     holder.describe(), code="X_DB_HORIZON_PINNED", pid=holder.pid,
                                     application_name=holder.application_name, state=holder.state,
                                     age=round(holder.age, 1))
            await asyncio.sleep(HORIZON_CHECK)

    async def _prune(self, older_than: float) -> None:
        # Retention: finished rows are what every hot statement of a queue would otherwise walk
        # past. Jittered, so a fleet started together does not prune all at once (it may: the
        # chunks skip each other's rows).
        while True:
            await asyncio.sleep(PRUNE_INTERVAL * (0.5 + self._rand()))
            try:
                deleted = await self._io(self.driver.prune, older_than)
            except Exception as error:
                _throttled.warning("prune", "could not prune finished jobs (%s); will retry", first_line(str(error)))
                continue
            if deleted:
                log.info("pruned %d finished job(s) older than %s", deleted, _age(older_than),
                         extra={"pruned": deleted})

    async def _schedules(self) -> None:
        # Wake at each tick (re-checking at least every SCHEDULE_RECHECK seconds for rows another
        # process moved or an operator paused) and offer what is due; see jobs/scheduler.py.
        names = set(self.names)
        scheduler = Scheduler(self.driver, [d for d in declared_schedules() if d.handle.name in names],
                              environment=self.environment)
        if not scheduler.schedules:
            return
        log.info("worker %s fires %d schedule(s): %s", self.worker_id, len(scheduler.schedules),
                 ", ".join(d.key for d in scheduler.schedules))
        while True:
            try:
                fired = await self._io(scheduler.run_once, self.driver.clock.now())
                now = self.driver.clock.now()
                pause = min(SCHEDULE_RECHECK, max(0.0, scheduler.next_wake(now) - now)) + 0.005
            except Exception as error:  # never let the loop die quietly: schedules would stop firing
                _throttled.warning("schedules", "schedules could not fire (%s); will retry", first_line(str(error)))
                fired, pause = [], SCHEDULE_RECHECK
            for key, result in fired:
                if result.job is not None:
                    log.info("schedule %s fired its %s tick: job %s", key, tick_text(result.tick), result.job.id,
                             extra={"schedule": key, "job_id": result.job.id})
                    self._emit(WorkerEvent("scheduled", self.worker_id, job_id=result.job.id))
            await asyncio.sleep(pause)

    # -- loops ----------------------------------------------------------------------------------

    def _bind(self) -> Callable[[], None]:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        return self.driver.subscribe(self._notify)

    async def run(self) -> None:
        """Claim and run jobs until :meth:`stop`, then shut down gracefully."""
        if self.freeze_gc:
            gc.freeze()
        unsubscribe = self._bind()
        assert self._wake is not None
        self._claim_with_acks = True
        liveness: asyncio.Future[None] | None = None
        if self.liveness_interval is not None:
            try:
                await self._register()
            except BaseException:
                unsubscribe()
                self._close_pools()
                raise
            liveness = asyncio.ensure_future(self._liveness(self.liveness_interval))
        beats = asyncio.ensure_future(self._heartbeats())
        watch = asyncio.ensure_future(self._watch_unknown_names())
        ticks = asyncio.ensure_future(self._schedules()) if self.fire_schedules else None
        horizon = (asyncio.ensure_future(self._watch_horizon(self.horizon_warning))
                   if self.horizon_warning is not None else None)
        pruning = asyncio.ensure_future(self._prune(self.prune_after)) if self.prune_after is not None else None
        log.info("worker %s started", self.worker_id, extra={"queues": self.queues, "names": self.names})
        try:
            while not self._stopping:
                self._wake.clear()
                names = self.names
                free = self._room(names)
                claimed: list[ClaimedJob] = []
                if free > 0:
                    try:
                        claimed = await self._claim(free, names)
                    except Exception as error:
                        _throttled.warning("claim", "claim failed (%s: %s); backing off", type(error).__name__,
                                           first_line(str(error)))
                        await asyncio.sleep(min(5.0, self.poll_interval * 2))
                        continue
                    _throttled.recovered("claim", "claiming works again")
                    if not await self._hold(claimed):
                        break
                if free > 0 and (len(claimed) == free or getattr(claimed, "more", False)):
                    continue  # more may be waiting: claim again at once
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self._poll_timeout())
            await self._shutdown()
        finally:
            beats.cancel()
            watch.cancel()
            for task in (ticks, horizon, pruning):
                if task is not None:
                    task.cancel()
            if liveness is not None:
                liveness.cancel()
            # After the shutdown released what it held: nothing is left for a rescuer to take.
            await self._unregister()
            unsubscribe()
            # A cancelled task's driver call goes on in its thread: run() returns when the last one
            # ended, so the owner may close the driver at once (closing a SQLite connection another
            # thread is using crashes the process).
            await asyncio.to_thread(self._io_pool.shutdown, wait=True, cancel_futures=True)
            self._close_pools()

    async def drain(self, *, max_jobs: int | None = None) -> int:
        """Run jobs until none is runnable now (or ``max_jobs`` attempts ran); returns the count.

        Heartbeats run as in :meth:`run`. Meant for tests and foreground commands.
        """
        unsubscribe = self._bind()
        beats = asyncio.ensure_future(self._heartbeats())
        start = self.processed
        try:
            while True:
                budget = None if max_jobs is None else max_jobs - (self.processed - start) - len(self._active)
                free = self.concurrency - len(self._active)
                if budget is not None:
                    free = min(free, budget)
                held = len(self._active)
                claimed = await self._claim(free) if free > 0 and not self._stopping else []
                self._filling = True
                try:
                    for job in claimed:
                        self._start(job)
                finally:
                    self._filled()
                if not self._active:
                    if getattr(claimed, "more", False):
                        continue  # a key this claim filled hid others: the next claim leaves it out
                    if held and not claimed:
                        # The claim raced the last acks: it saw their rows still running (a flow
                        # key at its limit takes nothing). None is held now: ask again.
                        continue
                    break
                await asyncio.wait(self._pending(), return_when=asyncio.FIRST_COMPLETED)
        finally:
            beats.cancel()
            unsubscribe()
        return self.processed - start

    def _pending(self) -> set[asyncio.Future[Any]]:
        """What an attempt still held may be waiting on: its handler's task, else its ack's batch
        (written now if it is still queued)."""
        running: set[asyncio.Future[Any]] = {a.task for a in self._active.values()
                                             if a.task is not None and not a.task.done()}
        if not running and self._acks:
            self._flush_acks()
        return running | self._ack_writes or {a.task for a in self._active.values() if a.task is not None}

    def release_all(self) -> None:
        """Stop claiming and hand every running attempt back at once (no grace, no attempt
        burned): each is aborted with the shutdown reason and released to ``ready``. From the
        worker's loop thread (a signal handler), for a second Ctrl-C or an interrupted foreground run."""
        self._stopping = True
        for active in list(self._active.values()):
            active.signal.abort(SHUTDOWN)
        self._notify()

    def stop(self) -> None:
        """Stop claiming; running attempts finish within the grace period (safe from any thread)."""
        self._stopping = True
        self._notify()

    async def _shutdown(self) -> None:
        if self._ahead:
            # Claimed ahead and never started: back to ready at once, no attempt burned.
            ahead, self._ahead = list(self._ahead), deque()
            await self._release(ahead)
        tasks = {a.task for a in self._active.values() if a.task is not None}
        if tasks:
            log.info("worker stopping: waiting up to %ss for %d attempt(s)", self.grace_period, len(tasks))
            _, pending = await asyncio.wait(tasks, timeout=self.grace_period)
            if pending:
                for active in list(self._active.values()):
                    active.signal.abort(SHUTDOWN)
                await asyncio.wait(pending, timeout=10.0)
        # Attempts end with their ack's commit: write what is queued now, not after ack_delay (the
        # loop may be gone by then), and wait for the batches in flight (one may carry claimed jobs
        # to release).
        self._flush_acks()
        if self._ack_writes:
            await asyncio.wait(set(self._ack_writes), timeout=10.0)
        log.info("worker %s stopped", self.worker_id)

    def _close_pools(self) -> None:
        self._handler_pool.shutdown(wait=False, cancel_futures=True)
        self._io_pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Release the worker's threads (after :meth:`drain`; :meth:`run` does it itself), once
        the driver calls still in flight (a heartbeat) have ended."""
        self._io_pool.shutdown(wait=True, cancel_futures=True)
        self._close_pools()

    def run_forever(self) -> None:
        """Run until SIGTERM or SIGINT, then stop gracefully. For ``x worker``."""

        signals = 0

        def on_signal() -> None:
            nonlocal signals
            signals += 1
            if signals == 1:
                log.info("stopping: running attempts get %ss to finish (signal again to release them now)",
                         self.grace_period)
                self.stop()
            else:
                log.warning("second signal: releasing %d running attempt(s) now, no attempt burned",
                            len(self._active))
                self.release_all()

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (os_signal.SIGTERM, os_signal.SIGINT):
                loop.add_signal_handler(sig, on_signal)
            await self.run()

        asyncio.run(main())
