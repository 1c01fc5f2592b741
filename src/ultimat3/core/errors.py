"""Coded errors: every failure the library reports has a stable code, a message and a hint."""

from __future__ import annotations

from typing import Any, NoReturn


class XError(Exception):
    """Base error of the library.

    ``code`` is stable (``X_...``) so operators and tests match on it; ``message`` names the thing
    that is wrong; ``hint`` says what to write instead. ``retryable`` tells the worker whether a
    job attempt that raised it may be retried or must be dead-lettered at once.
    """

    code: str = "X_ERROR"
    retryable: bool = True

    def __init__(self, message: str, hint: str = "", *, code: str | None = None, **details: Any) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.hint = hint
        self.details: dict[str, Any] = details

    def __str__(self) -> str:
        text = f"{self.code}: {self.message}"
        return f"{text}\n  hint: {self.hint}" if self.hint else text

    def to_json(self) -> dict[str, Any]:
        """The error as plain JSON, the shape every ``--json`` command prints."""
        return {"code": self.code, "message": self.message, "hint": self.hint}


def first_line(text: object, default: str = "") -> str:
    """The first non-blank-trimmed line of ``text`` (an error message, a stored traceback), or
    ``default`` when there is none: what one-line logs and messages quote."""
    stripped = str(text).strip() if text is not None else ""
    return stripped.splitlines()[0] if stripped else default


class ConfigError(XError):
    """A declaration or a configuration value is wrong; raised where it was written."""

    code = "X_CONFIG"
    retryable = False


def check(cond: object, message: str, hint: str, *, code: str = "X_CONFIG") -> None:
    """Raise a non-retryable :class:`XError` with ``code`` unless ``cond`` holds."""
    if not cond:
        fail(message, hint, code=code)


def fail(message: str, hint: str, *, code: str = "X_CONFIG") -> NoReturn:
    """Raise a non-retryable :class:`XError` with ``code``."""
    raise ConfigError(message, hint, code=code)


class Interrupted(XError):
    """The operator interrupted (Ctrl-C) a foreground command; the CLI exits 130 with this line."""

    code = "X_INTERRUPTED"
    retryable = False
