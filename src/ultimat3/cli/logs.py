"""Worker logs: readable lines for a person, one JSON object per line for a log pipeline.

Hand-written rather than a dependency: it is a few lines over the stdlib ``logging.Formatter``, and
the core keeps its dependency list to what it cannot do without.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Literal

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "JsonFormatter", "configure_logging"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")
LogFormat = Literal["text", "json"]
# The attributes every LogRecord has; anything else was passed as extra= and belongs in the object.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the exception's text, and every
    ``extra=`` field (job_id, job_name, queue, attempt, outcome, error...)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        data: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def configure_logging(level: str, fmt: LogFormat) -> None:
    """Install one stderr handler on the root logger with ``level`` and ``fmt``."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
