"""Backfills: declared, paced, resumable, ledgered, tenant-aware passes over the app's tables.

``definition`` holds the types every other module imports; ``declare`` is :func:`backfill`;
``sweep`` runs a pass; ``pacer`` paces it; ``engines`` finds its database; ``checks`` refuses what
must not start; ``progress`` reports; ``foreground`` runs one in the caller's process; ``registry``
enumerates the declared set; ``scope`` grants the cross-tenant capability; ``checksum`` fingerprints
the code; ``sizing`` sizes pages (``adaptive``); ``cursor`` stores the key a pass resumes from;
``requires`` answers ``requires=``; ``gate`` is the deploy gate.
"""

from ultimat3.backfill.checks import check_source_tables, requirement_error
from ultimat3.backfill.declare import backfill
from ultimat3.backfill.definition import (
    DEFAULT_BACKFILL_BATCH,
    JOB_STORE,
    BackfillDefinition,
    BackfillError,
    BackfillInput,
    BackfillProgress,
    BackfillReport,
    Batch,
    DryRun,
    batch_step_name,
)
from ultimat3.backfill.engines import dispose_engines, engine_for_url
from ultimat3.backfill.foreground import dry_run, run_backfill
from ultimat3.backfill.gate import (
    BackfillStatusRow,
    PendingBackfill,
    backfill_status,
    hold_reason,
    pending_backfills,
    pending_reason,
)
from ultimat3.backfill.health import DEFAULT_HEALTH, Health, health
from ultimat3.backfill.pacer import DEFAULT_BACKFILL_RATE, Pacer
from ultimat3.backfill.progress import ProgressListener, add_progress_listener
from ultimat3.backfill.registry import (
    BackfillDeclaration,
    backfill_origin,
    declaration_of,
    get_backfill,
    is_backfill,
    registered_backfills,
)
from ultimat3.backfill.requires import (
    AlembicRevision,
    MigrationRequirement,
    RequirementNotApplied,
    XMigration,
    alembic_revision,
    x_migration,
)
from ultimat3.backfill.sizing import Adaptive, adaptive
from ultimat3.backfill.sweep import run_pass

__all__ = [
    "DEFAULT_BACKFILL_BATCH",
    "DEFAULT_BACKFILL_RATE",
    "DEFAULT_HEALTH",
    "JOB_STORE",
    "Adaptive",
    "AlembicRevision",
    "BackfillDeclaration",
    "BackfillDefinition",
    "BackfillError",
    "BackfillInput",
    "BackfillProgress",
    "BackfillReport",
    "BackfillStatusRow",
    "Batch",
    "DryRun",
    "Health",
    "MigrationRequirement",
    "Pacer",
    "PendingBackfill",
    "ProgressListener",
    "RequirementNotApplied",
    "XMigration",
    "adaptive",
    "add_progress_listener",
    "alembic_revision",
    "backfill",
    "backfill_origin",
    "backfill_status",
    "batch_step_name",
    "check_source_tables",
    "declaration_of",
    "dispose_engines",
    "dry_run",
    "engine_for_url",
    "get_backfill",
    "health",
    "hold_reason",
    "is_backfill",
    "pending_backfills",
    "pending_reason",
    "registered_backfills",
    "requirement_error",
    "run_backfill",
    "run_pass",
    "x_migration",
]
