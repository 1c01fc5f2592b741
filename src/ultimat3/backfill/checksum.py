"""A backfill's checksum: a stable hash of what its ``source`` and ``handle`` DO.

The ledger stores it with every pass so an operator can tell "completed" from "completed, but the
code has changed since". It covers the two functions' code only, never ``rate`` or ``batch``:
those tune how fast a pass goes, not what it does to the data.

Stable across processes: the code is read as source text and normalised through ``ast`` (so
comments, blank lines and indentation do not count), and only when no source is available does it
fall back to the compiled code object — bytecode, constants and names, walked recursively.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import linecache
import textwrap
import types
from collections.abc import Callable
from typing import Any

__all__ = [
    "backfill_checksum",
    "code_fingerprint",
]

#: Hex digits kept: plenty to tell two versions of one backfill apart, short enough to print.
CHECKSUM_LENGTH = 16


def _normalise(text: str) -> str:
    dedented = textwrap.dedent(text)
    try:
        return ast.unparse(ast.parse(dedented))
    except SyntaxError:
        return "\n".join(line.rstrip() for line in dedented.strip().splitlines())


@functools.lru_cache(maxsize=64)
def _module_tree(filename: str, text: str) -> ast.Module | None:
    try:
        return ast.parse(text, filename)
    except SyntaxError:
        return None


def _lambda_source(code: types.CodeType) -> str | None:
    # inspect.getsource() on a lambda returns its whole line(s) — which, for a lambda written
    # inside backfill(...), would drag rate= and batch= into the hash. So find the lambda's own
    # node in the module and hash just that.
    filename = code.co_filename
    text = "".join(linecache.getlines(filename))
    if not text:
        return None
    tree = _module_tree(filename, text)
    if tree is None:
        return None
    body = [
        (line, col, end_line, end_col)
        for line, end_line, col, end_col in code.co_positions()
        if line is not None and end_line is not None and col is not None and end_col is not None
        and (line, col) != (end_line, end_col)
    ]
    best: ast.Lambda | None = None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Lambda) or node.lineno != code.co_firstlineno:
            continue
        end_line = node.end_lineno if node.end_lineno is not None else node.lineno
        end_col = node.end_col_offset if node.end_col_offset is not None else 1 << 30
        inside = all(
            (node.lineno, node.col_offset) <= (line, col) and (e_line, e_col) <= (end_line, end_col)
            for line, col, e_line, e_col in body
        )
        # Several lambdas may share a line (or nest): the innermost one holding the body is ours.
        if inside and (best is None or (node.lineno, node.col_offset) > (best.lineno, best.col_offset)):
            best = node
    return None if best is None else ast.unparse(best)


def _def_source(fn: Callable[..., Any]) -> str | None:
    try:
        return _normalise(inspect.getsource(fn))
    except (OSError, TypeError):
        return None


def _const_text(value: object) -> str:
    if isinstance(value, types.CodeType):
        return "code(" + _code_text(value) + ")"
    if isinstance(value, frozenset):
        # Set iteration order depends on string hashing, which is randomised per process.
        return "frozenset(" + ",".join(sorted(_const_text(item) for item in value)) + ")"
    if isinstance(value, tuple):
        return "(" + ",".join(_const_text(item) for item in value) + ")"
    return repr(value)


def _code_text(code: types.CodeType) -> str:
    parts = [
        code.co_code.hex(),
        ",".join(code.co_names),
        ",".join(_const_text(const) for const in code.co_consts),
    ]
    return "|".join(parts)


def code_fingerprint(fn: object) -> str:
    """A normalised text that changes when ``fn``'s code changes and only then.

    Source text through ``ast`` when it can be found (a lambda is cut out of its line); otherwise
    the code object's bytecode, names and constants. Partials and callable objects are followed
    to the function underneath.
    """
    if isinstance(fn, functools.partial):
        args = ",".join(_const_text(arg) for arg in fn.args)
        kwargs = ",".join(f"{key}={_const_text(value)}" for key, value in sorted(fn.keywords.items()))
        return f"partial({code_fingerprint(fn.func)};{args};{kwargs})"
    target: Any = fn
    if inspect.ismethod(target):
        target = target.__func__
    if callable(target) and not inspect.isfunction(target) and not inspect.isbuiltin(target):
        # A callable instance: its behaviour is its class's __call__.
        target = getattr(type(target), "__call__", target)  # noqa: B004 - want the class attribute
    target = inspect.unwrap(target) if callable(target) else target
    code = getattr(target, "__code__", None)
    if not isinstance(code, types.CodeType):
        return f"opaque:{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
    text = _lambda_source(code) if code.co_name == "<lambda>" else _def_source(target)
    return text if text is not None else "code:" + _code_text(code)


def backfill_checksum(source: Callable[..., Any], handle: Callable[..., Any]) -> str:
    """The checksum recorded with every pass: a shortened sha256 over ``source`` and ``handle``."""
    digest = hashlib.sha256()
    for part in ("source", code_fingerprint(source), "handle", code_fingerprint(handle)):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:CHECKSUM_LENGTH]
