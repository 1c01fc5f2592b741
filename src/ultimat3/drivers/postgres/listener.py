"""LISTEN/NOTIFY wake-ups: one daemon thread per driver on its own dedicated connection.

Every enqueue sends ``pg_notify(channel, queue)`` inside its transaction, so the notification is
delivered exactly when the job commits. The listener turns each one into a call of the driver's
dispatch function with the queue name, which is what lets an idle worker start a job within
milliseconds instead of at its next poll.

A LISTEN is only as good as its connection: a server restart or ``pg_terminate_backend`` drops it
and every notification sent meanwhile is lost. So on any error the listener reconnects with a
capped exponential backoff and, once listening again, dispatches ``"*"`` ("something may have
changed on any queue") so workers re-poll for whatever they missed.

A LISTEN can also be in effect and hear nothing: behind a transaction-mode pooler the session that
ran it belongs to other clients a moment later. So once listening (and after every reconnect) the
listener proves it hears: ``probe`` sends a NOTIFY of a fresh token from another session, which
must arrive within ``probe_timeout``. When it does not, one coded ``X_DB_NOTIFY_LOST`` line says
why and what to set, :attr:`hears` turns false (workers poll at their floor meanwhile), and the
probe is repeated every ``reprobe_interval`` until notifications arrive again.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from ultimat3.core.errors import first_line

__all__ = ["WAKE_ALL", "Listener"]

from ultimat3.core.throttle import ThrottledLog

_log = logging.getLogger(__name__)
_throttled = ThrottledLog(_log)

#: Dispatched after (re)connecting: notifications may have been missed on every queue.
WAKE_ALL = "*"
# Postgres truncates identifiers past 63 bytes; keep the private channel distinct within that.
_MAX_CHANNEL = 63


class Listener:
    """A daemon thread that LISTENs on ``channel`` and dispatches each payload (a queue name).

    ``conninfo`` is a libpq connection string or URL; ``connect_kwargs`` are extra connection
    parameters. Besides ``channel`` it listens on a private :attr:`wake_channel`, so :meth:`stop`
    can be made prompt by notifying it (the wait for notifications holds the connection's lock,
    so the connection cannot simply be closed from another thread).
    """

    def __init__(
        self,
        conninfo: str,
        channel: str,
        dispatch: Callable[[str], None],
        *,
        poll_interval: float = 1.0,
        ping_interval: float = 30.0,
        initial_backoff: float = 0.05,
        max_backoff: float = 5.0,
        connect_kwargs: dict[str, Any] | None = None,
        probe: Callable[[str, str], None] | None = None,
        on_probe: Callable[[bool], None] | None = None,
        probe_timeout: float = 1.0,
        reprobe_interval: float = 30.0,
    ) -> None:
        self.conninfo = conninfo
        self.channel = channel
        suffix = "_wake_" + uuid.uuid4().hex[:12]
        self.wake_channel = channel[: _MAX_CHANNEL - len(suffix)] + suffix
        self._dispatch = dispatch
        self._poll_interval = poll_interval
        self._ping_interval = ping_interval
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": 5,
            # A silently dead peer (no RST) would otherwise leave us waiting forever.
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
            **(connect_kwargs or {}),
        }
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._backend_pid: int | None = None
        #: How many times a connection was established and LISTEN issued (1 = never reconnected).
        self.connections = 0
        self._probe = probe
        self._on_probe = on_probe
        self._probe_timeout = probe_timeout
        self._reprobe_interval = reprobe_interval
        #: ``None`` until the first probe settles; then whether a NOTIFY from another session arrived.
        self.hears: bool | None = None
        self._heard = threading.Event()

    @property
    def backend_pid(self) -> int | None:
        """The server process of the current listening connection (``None`` while disconnected)."""
        with self._lock:
            return self._backend_pid

    @property
    def listening(self) -> bool:
        """Whether LISTEN is in effect right now."""
        return self._listening.is_set()

    def start(self) -> None:
        """Start the thread (once)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name=f"ultimat3-listen-{self.channel}", daemon=True)
            self._thread.start()

    def wait_probed(self, timeout: float) -> bool | None:
        """Block until the first probe settled (or ``timeout``); returns :attr:`hears`."""
        self._heard.wait(timeout)
        return self.hears

    def wait_listening(self, timeout: float) -> bool:
        """Block until LISTEN is in effect (``False`` when ``timeout`` real seconds pass first)."""
        return self._listening.wait(timeout)

    def request_stop(self) -> None:
        """Ask the thread to end; it notices within ``poll_interval`` (at once if woken)."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = self._initial_backoff
        missed = False
        while not self._stop.is_set():
            established = threading.Event()
            try:
                self._listen(missed, established)
            except Exception as exc:  # any failure: the connection is gone or unusable
                if not self._stop.is_set():
                    first = first_line(exc, type(exc).__name__)
                    _throttled.warning("listen", "LISTEN %s lost (%s); reconnecting", self.channel, first)
            finally:
                self._listening.clear()
                with self._lock:
                    self._backend_pid = None
            # Whatever was sent while we were not listening is lost: say so on reconnect.
            missed = True
            # A connection that worked is retried at once-ish; repeated failures back off, capped.
            backoff = self._initial_backoff if established.is_set() else min(backoff * 2, self._max_backoff)
            if self._stop.wait(backoff):
                break

    def _listen(self, missed: bool, established: threading.Event) -> None:
        with psycopg.connect(self.conninfo, **self._connect_kwargs) as conn:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.wake_channel)))
            with self._lock:
                self._backend_pid = conn.info.backend_pid
                self.connections += 1
            established.set()
            self._listening.set()
            if missed:
                self._safe_dispatch(WAKE_ALL)
            last_seen = time.monotonic()
            token, deadline = self._send_probe()
            while not self._stop.is_set():
                wait = self._poll_interval if deadline is None else max(0.01, min(
                    self._poll_interval, deadline - time.monotonic()))
                for notify in conn.notifies(timeout=wait):
                    last_seen = time.monotonic()
                    if notify.channel == self.wake_channel:
                        if self._stop.is_set():
                            return
                        if token is not None and notify.payload == token:
                            self._settle_probe(True)
                            token, deadline = None, None
                        continue
                    self._safe_dispatch(notify.payload)
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    if token is not None:  # the probe never arrived
                        self._settle_probe(False)
                        token, deadline = None, now + self._reprobe_interval
                    else:  # time to try again
                        token, deadline = self._send_probe()
                if time.monotonic() - last_seen >= self._ping_interval:
                    # A quiet channel and a dead connection look alike; a round trip tells them apart.
                    conn.execute("SELECT 1")
                    last_seen = time.monotonic()

    def _send_probe(self) -> tuple[str | None, float | None]:
        """NOTIFY a fresh token on the private channel from another session; (token, deadline)."""
        if self._probe is None:
            return None, None
        token = "probe:" + uuid.uuid4().hex
        try:
            self._probe(self.wake_channel, token)
        except Exception as exc:  # cannot send: try again later, judge nothing
            _log.debug("NOTIFY probe could not be sent: %s", exc)
            return None, time.monotonic() + self._reprobe_interval
        return token, time.monotonic() + self._probe_timeout

    def _settle_probe(self, heard: bool) -> None:
        was = self.hears
        self.hears = heard
        if self._on_probe is not None:
            try:
                self._on_probe(heard)
            except Exception:
                _log.exception("NOTIFY probe callback failed")
        if heard and was is False:
            _log.warning("wake-ups from other processes work again on %s (LISTEN hears NOTIFY)", self.channel)
        elif not heard and was is not False:
            _log.warning(
                "X_DB_NOTIFY_LOST: LISTEN %s is in effect but a NOTIFY from another session did not arrive"
                " within %.1fs; the likely cause is a transaction-mode connection pooler (PgBouncer, Supavisor,"
                " RDS Proxy) between this process and PostgreSQL. Workers poll instead, so jobs start later"
                " (hint: set X_DATABASE_DIRECT_URL, or direct_url=, to a connection that bypasses the pooler,"
                " or use the pooler's session mode)", self.channel, self._probe_timeout,
                extra={"code": "X_DB_NOTIFY_LOST"},
            )
        self._heard.set()  # last: whoever waits on the verdict sees its effects and its log line

    def _safe_dispatch(self, queue: str) -> None:
        try:
            self._dispatch(queue)
        except Exception:
            # A broken subscriber must not take the listener (and every other wake-up) down.
            _log.exception("wake-up dispatch failed for queue %r", queue)
