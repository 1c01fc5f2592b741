"""Serving the dashboard with uvicorn (``x web``)."""

from __future__ import annotations

import ipaddress
import socket

import uvicorn

from ultimat3.core.context import Environment
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import JobDriver
from ultimat3.web import create_app


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(driver: JobDriver, *, host: str, port: int, token: str | None, environment: Environment) -> None:
    """Serve the dashboard until interrupted. A port that is taken is refused coded (``X_WEB_PORT``)."""
    app = create_app(driver, token=token, environment=environment)
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as error:
        raise XError(f"cannot listen on {host}:{port}: {error.strerror or error}",
                     "pick a free port with --port, or stop what holds it", code="X_WEB_PORT") from None
    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False, proxy_headers=False)
