"""``x schedules ls|pause|resume|run``: the periodic jobs the app declares, and their ticks."""

from __future__ import annotations

import click
from rich.table import Table

from ultimat3.cli.config import Config
from ultimat3.cli.main import cli
from ultimat3.cli.render import cell, console, emit_json, iso, say, short_time
from ultimat3.core.clock import to_datetime
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import JobDriver, ScheduleRecord
from ultimat3.jobs.operator import default_actor
from ultimat3.jobs.scheduler import DeclaredSchedule, Scheduler, declared_schedules, next_fire, schedule_json


def _declared(config: Config) -> dict[str, DeclaredSchedule]:
    config.load_apps()
    return {d.key: d for d in declared_schedules()}


def _merged(config: Config, driver: JobDriver) -> list[tuple[str, DeclaredSchedule | None, ScheduleRecord | None]]:
    declared = _declared(config)
    rows = {row.key: row for row in config.call(driver.schedules.list)}
    return [(key, declared.get(key), rows.get(key)) for key in sorted(set(declared) | set(rows))]


@cli.group("schedules")
def schedules_group() -> None:
    """Periodic jobs: list, pause, resume, run one now."""


@schedules_group.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of schedules (see docs/cli.md).")
@click.pass_obj
def ls(config: Config, as_json: bool) -> None:
    """Every schedule the app declares (and any the database remembers): when it fires next, the
    last tick fired and its job, and whether it is paused."""
    driver = config.driver()
    merged = _merged(config, driver)
    now = driver.clock.now()
    if as_json:
        emit_json([schedule_json(key, d, row, now) for key, d, row in merged])
        return
    if not merged:
        say("no schedules declared (declare one with @job(..., schedule=cron(...)) and pass --app)")
        return
    table = Table(header_style="bold")
    for column in ("name", "schedule", "catch-up", "next fire", "last tick", "last job", "state"):
        table.add_column(column, no_wrap=column in ("name", "next fire", "last tick"), overflow="fold")
    for key, declared, row in merged:
        upcoming, due = next_fire(declared, row, now)
        state = (cell("paused", "bold red") if row and row.paused else
                 cell("not declared by --app", "yellow") if declared is None else cell("active", "green"))
        table.add_row(cell(key), cell(declared.schedule.describe() if declared else ""),
                      cell(declared.schedule.catch_up if declared else ""),
                      cell(("due now; " if due else "") + (upcoming or "")),
                      short_time(row.last_tick) if row else "", cell(row.last_job_id if row else ""), state)
    console.print(table)


def _known(config: Config, driver: JobDriver, name: str, *, must_be_declared: bool = False) -> DeclaredSchedule | None:
    declared = _declared(config)
    if name in declared:
        return declared[name]
    if not must_be_declared and config.call(driver.schedules.get, name) is not None:
        return None
    known = ", ".join(sorted(declared)) or "none (is --app set?)"
    raise XError(f"no schedule is named {name!r}", f"pick one of: {known}", code="X_SCHEDULE_UNKNOWN")


def _switch(config: Config, name: str, actor: str | None, as_json: bool, *, pause: bool) -> None:
    driver = config.driver()
    _known(config, driver, name)
    changed = config.call(driver.schedules.set_paused, name, pause, actor or default_actor())
    if as_json:
        emit_json({"name": name, "paused": pause, "changed": changed})
        return
    if pause:
        say(f"{name} is paused: its ticks pass without running" if changed else f"{name} was already paused")
    else:
        say(f"{name} is active again from its next tick" if changed else f"{name} was not paused")


@schedules_group.command("pause")
@click.argument("name")
@click.option("--actor", help="Who acts, for the audit log (default: cli:<your login>).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def pause(config: Config, name: str, actor: str | None, as_json: bool) -> None:
    """Pause schedule NAME (persisted): its ticks pass without running until it is resumed."""
    _switch(config, name, actor, as_json, pause=True)


@schedules_group.command("resume")
@click.argument("name")
@click.option("--actor", help="Who acts, for the audit log (default: cli:<your login>).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def resume(config: Config, name: str, actor: str | None, as_json: bool) -> None:
    """Resume schedule NAME from its next tick (the ticks it missed while paused do not run)."""
    _switch(config, name, actor, as_json, pause=False)


@schedules_group.command("run")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def run(config: Config, name: str, as_json: bool) -> None:
    """Enqueue one run of schedule NAME now, with the input its next tick would get; its ticks
    are unchanged."""
    driver = config.driver()
    declared = _known(config, driver, name, must_be_declared=True)
    assert declared is not None
    job_id = config.call(Scheduler(driver, [declared], environment=config.environment).fire_now, declared)
    if as_json:
        emit_json({"name": name, "job_id": job_id, "at": iso(to_datetime(driver.clock.now()))})
        return
    say(f"{name}: enqueued job {job_id} now (`x jobs show {job_id}`)")
