"""The dashboard's ASGI app: HTML pages, the JSON API they are built from, and the three actions.

Endpoints that read are plain functions, so Starlette runs them in its thread pool: a driver call
never blocks the event loop. Every page re-renders its ``<main>`` when asked with ``X-Partial: 1``;
``static/app.js`` does that every few seconds, so pages stay live without a reload.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from jinja2 import Environment as Templates
from jinja2 import FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ultimat3.core.context import Environment
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import JOB_STATES, JobDriver
from ultimat3.web import actions
from ultimat3.web.security import CSRF_FIELD, SECURITY_HEADERS, SESSION_COOKIE, Guard
from ultimat3.web.views import PAGE_SIZE, Views, job_json

HERE = Path(__file__).parent
#: How often a page refreshes its data, in milliseconds.
REFRESH_MS = 2000
_NOT_FOUND = {"X_JOB_NOT_FOUND", "X_BACKFILL_UNKNOWN", "X_WEB_NOT_FOUND"}


class _Headers(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response


def _ago(value: str | None, now: str) -> str:
    if not value:
        return ""
    seconds = (datetime.fromisoformat(now) - datetime.fromisoformat(value)).total_seconds()
    return duration(seconds) + " ago" if seconds >= 0 else "in " + duration(-seconds)


def duration(seconds: float | None) -> str:
    """``42 s``, ``3 min``, ``2.5 h`` for a person."""
    if seconds is None or not math.isfinite(seconds):
        return ""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _short(value: str | None) -> str:
    return "" if not value else value.replace("T", " ")[:19]


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _templates() -> Templates:
    env = Templates(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True),
                    trim_blocks=True, lstrip_blocks=True)
    env.filters.update(duration=duration, short=_short, tojson_pretty=_json)
    env.globals.update(ago=_ago, states=JOB_STATES)
    return env


class Dashboard:
    """The endpoints, over one driver."""

    def __init__(self, driver: JobDriver, environment: Environment, token: str | None) -> None:
        self.views = Views(driver, environment)
        self.driver = driver
        self.environment = environment
        self.guard = Guard(token)
        self.templates = _templates()

    # ------------------------------------------------------------------ rendering
    def page(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        """A whole page, or only its ``<main>`` for the live refresh."""
        partial = request.headers.get("x-partial") == "1"
        root = _root(request)
        html = self.templates.get_template(template).render(
            root=root, layout="partial.html" if partial else "base.html", request=request, refresh_ms=REFRESH_MS,
            read_only=self.guard.read_only, signed_in=self.guard.session_of(request) is not None,
            csrf=self.guard.csrf_for(request), csrf_field=CSRF_FIELD, path=request.url.path[len(root):] or "/",
            now=datetime.now(UTC).isoformat(), notice=request.query_params.get("notice"), **context)
        return HTMLResponse(html, status_code=status)

    def error_page(self, request: Request, error: XError, status: int) -> HTMLResponse:
        """A coded error as a page: code, message, hint."""
        return self.page(request, "error.html", status=status, error=error)

    @staticmethod
    def status_of(error: XError) -> int:
        """404 for what does not exist, 403 for refusals of the guard, 400 for the rest."""
        if error.code in _NOT_FOUND:
            return 404
        return 403 if error.code in ("X_WEB_READ_ONLY", "X_WEB_FORBIDDEN") else 400

    # ------------------------------------------------------------------ reads (HTML)
    def overview(self, request: Request) -> Response:
        """``/``: queues and the completions chart."""
        data = self.views.overview()
        peak = max(data["completed_per_minute"] or [0]) or 1
        return self.page(request, "overview.html", data=data, peak=peak)

    def jobs(self, request: Request) -> Response:
        """``/jobs``: filters, a keyset page, find by id (a redirect to the job)."""
        try:
            query = _job_query(request)
            if query.pop("find", None):
                return RedirectResponse(f"{_root(request)}/jobs/{quote(query['find_id'], safe='')}", status_code=303)
            query.pop("find_id", None)
            data = self.views.jobs(**query)
        except XError as error:
            return self.error_page(request, error, 400)
        params = {k: v for k, v in data["filter"].items() if v and k != "before"}
        root = _root(request)
        next_url = f"{root}/jobs?" + urlencode({**params, "before": data["next"]}) if data["next"] else None
        first_url = f"{root}/jobs?" + urlencode(params) if data["filter"]["before"] else None
        return self.page(request, "jobs.html", data=data, next_url=next_url, first_url=first_url,
                         queues=self.views.queue_names())

    def job(self, request: Request) -> Response:
        """``/jobs/ID``: one job, its attempts and steps."""
        data = self.views.job(request.path_params["job_id"])
        if data is None:
            return self.error_page(request, _no_job(request.path_params["job_id"]), 404)
        return self.page(request, "job.html", data=data)

    def backfills(self, request: Request) -> Response:
        """``/backfills``: every declared backfill and its latest pass."""
        return self.page(request, "backfills.html", data=self.views.backfills())

    def backfill(self, request: Request) -> Response:
        """``/backfills/NAME``: every pass and the quarantined rows."""
        name = request.path_params["name"]
        data = self.views.backfill(name)
        if data is None:
            return self.error_page(request, _no_backfill(name), 404)
        return self.page(request, "backfill.html", data=data)

    def workers(self, request: Request) -> Response:
        """``/workers``: the registry and what each worker runs."""
        return self.page(request, "workers.html", data=self.views.workers())

    def schedules(self, request: Request) -> Response:
        """``/schedules``: next fire, last tick, paused."""
        return self.page(request, "schedules.html", data=self.views.schedules())

    def limits(self, request: Request) -> Response:
        """``/limits``: concurrency slots and rate buckets in use."""
        return self.page(request, "limits.html", data=self.views.limits())

    def login_form(self, request: Request) -> Response:
        """``GET /login``: the token form (or why there is none)."""
        return self.page(request, "login.html")

    # ------------------------------------------------------------------ reads (JSON)
    def api(self, read: Callable[[Request], Any]) -> Callable[[Request], Response]:
        """A JSON read: the view's dict, or a coded error."""
        def endpoint(request: Request) -> Response:
            try:
                data = read(request)
            except XError as error:
                return JSONResponse({"error": error.to_json()}, status_code=self.status_of(error))
            return JSONResponse(data)
        return endpoint

    # ------------------------------------------------------------------ actions
    async def login(self, request: Request) -> Response:
        """``POST /login``: a session cookie for the right token, from this site only."""
        form = await _form(request)
        if self.guard.read_only:
            return self.error_page(request, _read_only(), 403)
        if not self.guard.same_origin(request) or not self.guard.token_matches(form.get("token")):
            return self.page(request, "login.html", status=403, failed=True)
        response = RedirectResponse(_root(request) + _local(form.get("next")), status_code=303)
        response.set_cookie(SESSION_COOKIE, self.guard.new_session(), httponly=True, samesite="strict",
                            secure=request.url.scheme == "https", path=_root(request) + "/")
        return response

    async def logout(self, request: Request) -> Response:
        """``POST /logout``: end the session (CSRF-checked like any change)."""
        form = await _form(request)
        if not self.guard.form_ok(request, form.get(CSRF_FIELD)):
            return self.error_page(request, _forbidden(), 403)
        response = RedirectResponse(_root(request) + "/", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=_root(request) + "/")
        return response

    def action(self, run: Callable[[Request, str], Any], back: Callable[[Request, Any], str],
               *, api: bool) -> Callable[[Request], Awaitable[Response]]:
        """A change: refused unless the guard allows it; run in the thread pool; a JSON answer for
        the API, a redirect back (with a notice) for a form."""
        async def endpoint(request: Request) -> Response:
            form = {} if api else await _form(request)
            try:
                if self.guard.read_only:
                    raise _read_only()
                if api:
                    allowed = self.guard.bearer_ok(request) or self.guard.form_ok(
                        request, request.headers.get("x-csrf-token"))
                else:
                    allowed = self.guard.form_ok(request, form.get(CSRF_FIELD))
                if not allowed:
                    raise _forbidden()
                actor = "web:" + ("token" if self.guard.bearer_ok(request) else "session")
                result = await run_in_threadpool(run, request, actor)
            except XError as error:
                if api:
                    return JSONResponse({"error": error.to_json()}, status_code=self.status_of(error))
                return self.error_page(request, error, self.status_of(error))
            if api:
                return JSONResponse(result)
            return RedirectResponse(_root(request) + back(request, result), status_code=303)
        return endpoint

    def do_cancel(self, request: Request, actor: str) -> dict[str, Any]:
        """Cancel the job in the path."""
        return {"job": job_json(actions.cancel(self.driver, request.path_params["job_id"], actor))}

    def do_retry(self, request: Request, actor: str) -> dict[str, Any]:
        """Retry the job in the path."""
        return {"job": job_json(actions.retry(self.driver, request.path_params["job_id"], actor))}

    def do_start(self, request: Request, actor: str) -> dict[str, Any]:
        """Start a pass of the backfill in the path."""
        return actions.start_backfill(self.driver, self.environment, request.path_params["name"], actor)


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (the first value of each); nothing else is accepted."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return {k: v[0] for k, v in parse_qs(body, keep_blank_values=False).items()}


def _root(request: Request) -> str:
    """The prefix the app is mounted under (``""`` when served on its own)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _local(target: str | None) -> str:
    """Where to go after signing in: a path on this site, never another site (``//host`` and
    ``/\\host`` are other sites to a browser)."""
    if not target or not target.startswith("/") or target[1:2] in ("/", "\\") or any(c in target for c in "\r\n"):
        return "/"
    return target


def _job_query(request: Request) -> dict[str, Any]:
    q = request.query_params
    query: dict[str, Any] = {k: (q.get(k) or None) for k in ("queue", "name", "state", "tenant", "error", "before")}
    if q.get("id"):
        query["find"] = True
        query["find_id"] = q["id"].strip()
    limit = q.get("limit")
    if limit:
        try:
            query["limit"] = int(limit)
        except ValueError as error:
            raise XError(f"limit must be a whole number, not {limit!r}", f"pass limit={PAGE_SIZE}",
                         code="X_WEB_FILTER") from error
    return query


def _no_job(job_id: str) -> XError:
    return XError(f"no job has id {job_id!r}", "copy an id from the jobs page", code="X_JOB_NOT_FOUND")


def _no_backfill(name: str) -> XError:
    return XError(f"no backfill named {name!r} is declared or in the ledger", "pick one on the backfills page",
                  code="X_BACKFILL_UNKNOWN")


def _read_only() -> XError:
    return XError("this dashboard is read-only: no token is configured",
                  "start it with X_WEB_TOKEN set to allow cancel, retry and starting backfills",
                  code="X_WEB_READ_ONLY")


def _forbidden() -> XError:
    return XError("this change needs the dashboard's token", "sign in with the token (or send "
                  "Authorization: Bearer TOKEN from a script)", code="X_WEB_FORBIDDEN")


def _required(data: dict[str, Any] | None, error: XError) -> dict[str, Any]:
    if data is None:
        raise error
    return data


def build(driver: JobDriver, environment: Environment, token: str | None) -> Starlette:
    """The Starlette app (see :func:`ultimat3.web.create_app`)."""
    d = Dashboard(driver, environment, token)
    v = d.views

    def job_back(request: Request, result: Any) -> str:
        return f"/jobs/{quote(request.path_params['job_id'], safe='')}?notice=" + str(result["job"]["state"])

    def backfill_back(request: Request, result: Any) -> str:
        return f"/backfills/{quote(request.path_params['name'], safe='')}?notice=started"

    def api_jobs(request: Request) -> Any:
        query = _job_query(request)
        query.pop("find", None)
        query.pop("find_id", None)
        return v.jobs(**query)

    routes = [
        Route("/", d.overview),
        Route("/jobs", d.jobs),
        Route("/jobs/{job_id}", d.job),
        Route("/jobs/{job_id}/cancel", d.action(d.do_cancel, job_back, api=False), methods=["POST"]),
        Route("/jobs/{job_id}/retry", d.action(d.do_retry, job_back, api=False), methods=["POST"]),
        Route("/backfills", d.backfills),
        Route("/backfills/{name}", d.backfill),
        Route("/backfills/{name}/start", d.action(d.do_start, backfill_back, api=False), methods=["POST"]),
        Route("/workers", d.workers),
        Route("/schedules", d.schedules),
        Route("/limits", d.limits),
        Route("/login", d.login_form, methods=["GET"]),
        Route("/login", d.login, methods=["POST"]),
        Route("/logout", d.logout, methods=["POST"]),
        Route("/api/overview", d.api(lambda r: v.overview())),
        Route("/api/jobs", d.api(api_jobs)),
        Route("/api/jobs/{job_id}", d.api(lambda r: _required(v.job(r.path_params["job_id"]),
                                                             _no_job(r.path_params["job_id"])))),
        Route("/api/jobs/{job_id}/cancel", d.action(d.do_cancel, job_back, api=True), methods=["POST"]),
        Route("/api/jobs/{job_id}/retry", d.action(d.do_retry, job_back, api=True), methods=["POST"]),
        Route("/api/backfills", d.api(lambda r: v.backfills())),
        Route("/api/backfills/{name}", d.api(lambda r: _required(v.backfill(r.path_params["name"]),
                                                                _no_backfill(r.path_params["name"])))),
        Route("/api/backfills/{name}/start", d.action(d.do_start, backfill_back, api=True), methods=["POST"]),
        Route("/api/workers", d.api(lambda r: v.workers())),
        Route("/api/schedules", d.api(lambda r: v.schedules())),
        Route("/api/limits", d.api(lambda r: v.limits())),
        Route("/favicon.ico", lambda r: RedirectResponse(_root(r) + "/static/favicon.svg", status_code=301)),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(_Headers)])
