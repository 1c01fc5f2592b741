"""What the dashboard may change: cancel a job, retry a job, start a pending backfill. Each is
refused coded when it does not apply, and recorded in the audit log like the CLI's actions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ultimat3.backfill.gate import hold_reason, pending_reason
from ultimat3.backfill.registry import declaration_of, get_backfill
from ultimat3.core.context import Environment
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import FINAL_STATES, AuditAction, JobDriver, JobRecord
from ultimat3.tenancy.grants import operator_context


def _audited(driver: JobDriver, actor: str, action: AuditAction, job_id: str,
             act: Callable[[], JobRecord | None]) -> JobRecord | None:
    entry = driver.audit.open(actor, action, {"ids": 1, "ids_sample": [job_id]})
    try:
        after = act()
    except BaseException:
        driver.audit.close(entry.id, "failed", 0)
        raise
    driver.audit.close(entry.id, "completed", 1)
    return after


def _known(driver: JobDriver, job_id: str) -> JobRecord:
    job = driver.introspect.get(job_id)
    if job is None:
        raise XError(f"no job has id {job_id!r}", "copy an id from the jobs page", code="X_JOB_NOT_FOUND")
    return job


def cancel(driver: JobDriver, job_id: str, actor: str) -> JobRecord:
    """Cancel a job that has not ended (a running attempt is fenced out at once)."""
    job = _known(driver, job_id)
    if job.state in FINAL_STATES:
        raise XError(f"job {job_id} is {job.state}; only a job that has not ended can be cancelled",
                     "retry it instead if it should run again", code="X_JOB_NOT_CANCELLABLE")
    after = _audited(driver, actor, "cancel", job_id, lambda: driver.cancel(job_id, f"cancelled by {actor}"))
    assert after is not None
    return after


def retry(driver: JobDriver, job_id: str, actor: str) -> JobRecord:
    """Run a dead or cancelled job again (attempts from 0, the same run: its steps are kept)."""
    job = _known(driver, job_id)
    if job.state not in ("dead", "cancelled"):
        raise XError(f"job {job_id} is {job.state}; only a dead or cancelled job can be retried",
                     "cancel it first if it must stop", code="X_JOB_NOT_RETRYABLE")
    after = _audited(driver, actor, "retry", job_id, lambda: driver.retry(job_id))
    assert after is not None
    return after


def start_backfill(driver: JobDriver, environment: Environment, name: str, actor: str) -> dict[str, Any]:
    """Enqueue a pass of a pending backfill, as ``x db backfill --enqueue-pending`` would: held when
    its environment or its required migration says no, forced when its code changed."""
    handle = get_backfill(name)
    declaration = None if handle is None else declaration_of(handle)
    if handle is None or declaration is None:
        raise XError(f"no backfill named {name!r} is declared by this app", "check the name on the backfills page",
                     code="X_BACKFILL_UNKNOWN")
    reason, _ = pending_reason(driver, name, declaration.checksum)
    if reason is None:
        raise XError(f"backfill {name!r} is not pending: its last pass completed under this code",
                     "`x db backfill NAME --force` runs it again on purpose", code="X_BACKFILL_NOT_PENDING")
    if reason == "failed-rows":
        raise XError(f"backfill {name!r} completed with rows quarantined; sweeping again would not fix them",
                     f"fix the rows, then `x db backfill {name} --retry-failed`", code="X_BACKFILL_FAILED_ROWS")
    held = hold_reason(driver, environment, declaration)
    if held is not None:
        raise held
    with operator_context(actor, f"x web: start backfill {name} ({reason})"):
        result = handle.enqueue({"force": reason == "checksum-changed"}, driver=driver)
    return {"name": name, "job_id": result.id, "run_id": result.run_id, "deduped": result.deduped}
