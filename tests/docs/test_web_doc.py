"""docs/web.md documents every route of the dashboard's JSON API, and no route it names is missing."""

from __future__ import annotations

import re
from pathlib import Path

from starlette.routing import Route

from ultimat3.drivers.memory import MemoryDriver
from ultimat3.web import create_app

DOC = Path(__file__).resolve().parents[2] / "docs" / "web.md"


def _shape(path: str) -> str:
    return re.sub(r"\{[a-z_]+\}", "X", path)


def test_every_api_route_is_documented_and_every_documented_route_exists() -> None:
    driver = MemoryDriver()
    app = create_app(driver, token_from_env=False)
    driver.close()
    routes = {_shape(r.path) for r in app.routes if isinstance(r, Route) and r.path.startswith("/api/")}
    text = DOC.read_text()
    found = re.findall(r"`(?:GET|POST) (/api/[^`? ]+)", text)
    documented = {_shape(re.sub(r"/(ID|NAME)\b", "/{x}", m)) for m in found}
    documented |= {_shape(re.sub(r"/(ID|NAME)\b", "/{x}", m)) for m in re.findall(r"POST (/api/[^`? ]+)", text)}
    assert routes <= documented, routes - documented
    assert documented <= routes, documented - routes
