"""`x web`: a taken port is one coded line (exit 2), a non-loopback bind without a token warns, and
the served app is the dashboard (uvicorn replaced by a recorder)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from tests.cli.conftest import X
from ultimat3.web.serve import is_loopback


def free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def test_loopback_hosts() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "example.com"))


def test_a_taken_port_is_refused_coded(x: X) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = x("web", "--port", str(port))
    assert result.exit_code == 2
    assert "X_WEB_PORT" in result.stderr and "--port" in result.stderr and "Traceback" not in result.stderr


def test_listening_beyond_loopback_without_a_token_warns(x: X, monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[dict[str, Any]] = []
    monkeypatch.setattr("uvicorn.run", lambda app, **options: served.append({"app": app, **options}))
    monkeypatch.delenv("X_WEB_TOKEN", raising=False)
    result = x("web", "--host", "0.0.0.0", "--port", free_port())
    assert result.exit_code == 0, result.output
    assert "without X_WEB_TOKEN" in result.stderr and "read-only" in result.stdout
    assert served and served[0]["host"] == "0.0.0.0"
    quiet = x("web", "--port", free_port(), env={"X_WEB_TOKEN": "a-long-enough-token-1234"})
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr and "actions need the token" in quiet.stdout


def test_a_short_token_is_refused_coded(x: X, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("uvicorn.run", lambda app, **options: None)
    result = x("web", "--port", free_port(), env={"X_WEB_TOKEN": "short"})
    assert result.exit_code == 2 and "X_WEB_TOKEN" in result.stderr and "secrets.token_urlsafe" in result.stderr
