"""``backfill()`` at declaration: what it refuses (with the name and a hint, registering nothing),
what it builds (a job), and what its checksum covers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from ultimat3.backfill import BackfillInput, Batch, alembic_revision, backfill, backfill_origin
from ultimat3.backfill.checksum import backfill_checksum, code_fingerprint
from ultimat3.core import XError
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.jobs import JobHandle, get_job, registered_jobs

metadata = sa.MetaData()
posts = sa.Table(
    "posts", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("slug", sa.String, nullable=True),
)


def source(ctx: Any) -> sa.Select[Any]:
    return sa.select(posts).where(posts.c.slug.is_(None))


def handle(batch: Batch) -> None:
    return None


def declare(**overrides: Any) -> JobHandle[BackfillInput]:
    fields: dict[str, Any] = {"name": "posts.fill_slug", "tenant": "none", "source": source, "handle": handle,
                              "engine": "job-store"}
    fields.update(overrides)
    return backfill(**fields)


def refused(code: str, **overrides: Any) -> XError:
    with pytest.raises(XError) as caught:
        declare(**overrides)
    assert caught.value.code == code
    assert caught.value.hint, "every refusal says what to write instead"
    assert registered_jobs() == [], "a refused declaration registers nothing"
    return caught.value


@pytest.mark.parametrize("batch", [0, -1, 1.5, True, "10", None])
def test_a_bad_batch_is_refused(batch: object) -> None:
    error = refused("X_BACKFILL_BATCH", batch=batch)
    assert '"posts.fill_slug"' in error.message
    assert "batch=1000" in error.hint


@pytest.mark.parametrize("rate", [0, -1, math.nan, math.inf, True, "5", None])
def test_a_bad_rate_is_refused(rate: object) -> None:
    error = refused("X_BACKFILL_RATE", rate=rate)
    assert '"posts.fill_slug"' in error.message
    assert "rate=5" in error.hint and "no unthrottled mode" in error.hint


@pytest.mark.parametrize("rate", [0.5, Fraction(1, 3), 1000, 2.5])
def test_fractional_and_large_rates_are_fine(rate: Any) -> None:
    handle_ = declare(rate=rate)
    origin = backfill_origin(handle_)
    assert origin is not None and origin.rate == float(rate) and origin.pacer.rate == float(rate)


def test_name_is_required() -> None:
    with pytest.raises(XError) as caught:
        backfill(tenant="none", source=source, handle=handle)  # type: ignore[call-arg]
    assert caught.value.code == "X_BACKFILL_NAME" and caught.value.hint
    refused("X_BACKFILL_NAME", name="")
    refused("X_BACKFILL_NAME", name=42)


def test_tenant_is_required() -> None:
    with pytest.raises(XError) as caught:
        backfill(engine="job-store", name="posts.fill_slug", source=source, handle=handle)  # type: ignore[call-arg]
    assert caught.value.code == "X_BACKFILL_TENANT" and "posts.fill_slug" in caught.value.message
    refused("X_BACKFILL_TENANT", tenant="everyone")


def test_source_and_handle_must_be_functions() -> None:
    assert "posts.fill_slug" in refused("X_BACKFILL_SOURCE", source=sa.select(posts)).message
    assert "posts.fill_slug" in refused("X_BACKFILL_HANDLE", handle="fill").message


@pytest.mark.parametrize("environments", [["prod"], [], "production", ["production", "qa"], 5])
def test_environments_must_be_environments(environments: object) -> None:
    error = refused("X_BACKFILL_ENVIRONMENTS", environments=environments)
    assert "posts.fill_slug" in error.message


def test_other_fields_are_checked_where_written() -> None:
    refused("X_BACKFILL_REQUIRES", requires="")
    refused("X_BACKFILL_REQUIRES", requires=7)
    refused("X_BACKFILL_COUNT", count=3)
    refused("X_BACKFILL_ENGINE", engine="sqlite:///x.db")
    refused("X_BACKFILL_ENGINE", engine=None)
    refused("X_BACKFILL_KEY", key=3)
    refused("X_JOB_QUEUE", queue="has space")
    refused("X_DURATION", timeout=-1)


def test_a_backfill_is_a_job() -> None:
    declared = declare(queue="sweeps", timeout="5m", environments=["staging", "production"])
    assert isinstance(declared, JobHandle)
    assert get_job("posts.fill_slug") is declared
    assert declared.input_model is BackfillInput
    assert declared.queue == "sweeps" and declared.timeout == 300
    # A plain def: the pass runs in the worker's thread pool.
    assert declared.is_async is False
    # One live pass per name, forced or not.
    assert declared.idempotency_key is not None
    assert declared.idempotency_key(BackfillInput(force=True)) == "posts.fill_slug"
    assert declared.idempotency_key(BackfillInput()) == "posts.fill_slug"
    origin = backfill_origin(declared)
    assert origin is not None and origin.environments == ("staging", "production")
    assert "posts.fill_slug" in declared.origin


def test_a_duplicate_name_is_refused_and_the_first_stays(memory: MemoryDriver) -> None:
    first = declare()
    with pytest.raises(XError) as caught:
        declare(batch=10)
    assert caught.value.code == "X_JOB_DUPLICATE_NAME"
    assert get_job("posts.fill_slug") is first
    origin = backfill_origin(first)
    assert origin is not None and origin.batch == 1000


def test_enqueue_dedupes_while_live_even_when_forced(memory: MemoryDriver) -> None:
    declared = declare()
    a = declared.enqueue(driver=memory)
    b = declared.enqueue({"force": True}, driver=memory)
    assert b.deduped and b.id == a.id
    with pytest.raises(XError) as caught:
        declared.enqueue({"forced": True}, driver=memory)
    assert caught.value.code == "X_JOB_INPUT"


def test_requires_accepts_an_id_or_an_alembic_revision(tmp_path: Path) -> None:
    declare(requires="app:0002_add_slug")
    origin = backfill_origin(declare(name="other", requires=alembic_revision("ae10", script_location=tmp_path)))
    assert origin is not None and origin.requires is not None
    assert origin.requires.label == "alembic:ae10"


# -- checksum ---------------------------------------------------------------------------------------


def test_checksum_covers_source_and_handle_but_not_rate_or_batch() -> None:
    base = backfill_origin(declare())
    tuned = backfill_origin(declare(name="tuned", rate=50, batch=10))
    assert base is not None and tuned is not None
    assert base.checksum == tuned.checksum

    def other_source(ctx: Any) -> sa.Select[Any]:
        return sa.select(posts).where(posts.c.slug == "")

    def other_handle(batch: Batch) -> None:
        print(batch.index)

    changed_source = backfill_origin(declare(name="s", source=other_source))
    changed_handle = backfill_origin(declare(name="h", handle=other_handle))
    assert changed_source is not None and changed_handle is not None
    assert len({base.checksum, changed_source.checksum, changed_handle.checksum}) == 3


def test_lambdas_are_hashed_alone_not_with_their_line() -> None:
    a = backfill(
        engine="job-store", name="a", tenant="none", source=lambda ctx: sa.select(posts), handle=lambda b: None, rate=5)
    b = backfill(
        engine="job-store", name="b", tenant="none", source=lambda ctx: sa.select(posts), handle=lambda b: None, rate=9)
    c = backfill(
        engine="job-store", name="c", tenant="none", source=lambda ctx: sa.select(posts.c.id), handle=lambda b: None)
    checksums = [backfill_origin(h).checksum for h in (a, b, c)]  # type: ignore[union-attr]
    assert checksums[0] == checksums[1] != checksums[2]
    pair = (lambda x: x + 1, lambda x: x + 2)
    assert code_fingerprint(pair[0]) == "lambda x: x + 1"
    assert code_fingerprint(pair[1]) == "lambda x: x + 2"


def test_formatting_and_comments_do_not_change_the_checksum() -> None:
    def first(batch: Batch) -> None:
        return None

    def second(batch: Batch) -> None:
        # a comment

        return    None

    assert code_fingerprint(first).replace("first", "second") == code_fingerprint(second)


def test_without_source_text_the_code_object_is_hashed() -> None:
    def compile_pair(body: str) -> tuple[Any, Any]:
        namespace: dict[str, Any] = {}
        exec(textwrap.dedent(body), namespace)
        return namespace["source"], namespace["handle"]

    first = compile_pair("""
        def source(ctx):
            return {"a", "b", "c"}
        def handle(batch):
            return [x for x in batch]
    """)
    same = compile_pair("""
        def source(ctx):
            return {"a", "b", "c"}
        def handle(batch):
            return [x for x in batch]
    """)
    changed = compile_pair("""
        def source(ctx):
            return {"a", "b", "d"}
        def handle(batch):
            return [x for x in batch]
    """)
    assert code_fingerprint(first[0]).startswith("code:")
    assert backfill_checksum(*first) == backfill_checksum(*same) != backfill_checksum(*changed)


APP = """
import sqlalchemy as sa
from ultimat3.backfill import backfill

t = sa.Table("t", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))

def source(ctx):
    return sa.select(t)

def handle(batch):
    return None

fill = backfill(engine="job-store", name="t.fill", tenant="none", source=source, handle=handle,
                rate=RATE, batch=BATCH)
lam = backfill(
    engine="job-store", name="t.lam", tenant="none",
    source=lambda ctx: sa.select(t).where(t.c.id > {{"a", "b"}}.__len__()),
    handle=lambda batch: None, rate=RATE)
"""

PRINT = (
    "import json, app; from ultimat3.backfill import backfill_origin; from ultimat3.jobs import get_job; "
    "print(json.dumps([backfill_origin(get_job(n)).checksum for n in ('t.fill', 't.lam')]))"
)


def _checksums_in_subprocess(tmp_path: Path, rate: str, batch: str, seed: str) -> list[str]:
    (tmp_path / "app.py").write_text(APP.replace("RATE", rate).replace("BATCH", batch).replace("{{", "{")
                                     .replace("}}", "}"))
    src = Path(__file__).resolve().parents[2] / "src"
    out = subprocess.run(
        [sys.executable, "-c", PRINT], cwd=tmp_path, capture_output=True, text=True, check=True,
        env={"PYTHONPATH": f"{tmp_path}:{src}", "PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
    )
    result: list[str] = json.loads(out.stdout)
    return result


def test_checksums_are_stable_across_processes(tmp_path: Path) -> None:
    # Different hash seeds (set constants iterate differently) and different tuning knobs.
    first = _checksums_in_subprocess(tmp_path, "5", "1000", "1")
    retuned = _checksums_in_subprocess(tmp_path, "50", "10", "2")
    assert first == retuned


def test_engine_is_required_and_never_guessed() -> None:
    fields: dict[str, Any] = {"name": "posts.fill_slug", "tenant": "none", "source": source, "handle": handle}
    with pytest.raises(XError) as caught:
        backfill(**fields)
    error = caught.value
    assert error.code == "X_BACKFILL_ENGINE"
    assert "posts.fill_slug" in error.message and "engine=" in error.hint and "job-store" in error.hint
    assert registered_jobs() == []
