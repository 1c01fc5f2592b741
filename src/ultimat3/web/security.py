"""Who may change anything through the dashboard, and the headers every response carries.

Read-only unless a token is configured (``X_WEB_TOKEN``). With one:

- a script sends ``Authorization: Bearer TOKEN`` (a header a browser never adds on its own, so
  no cross-site request can carry it);
- a person signs in once with the token; the session cookie is ``HttpOnly`` and
  ``SameSite=Strict`` and holds an HMAC of the token, never the token; every form carries a CSRF
  token derived from that session, and a request whose ``Origin`` names another site is refused.

Changing the token ends every session. Nothing here decides "allowed" when it cannot tell: a
missing or malformed credential is a refusal.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.requests import Request

SESSION_COOKIE = "x_web_session"
CSRF_FIELD = "csrf"

#: No inline script or style runs, nothing loads from elsewhere, no page frames this one.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass
class Guard:
    """The token check. ``token`` of ``None``: read-only, every change refused."""

    token: str | None
    #: Per-process key so a session cookie cannot be forged from the token's hash alone.
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    @property
    def read_only(self) -> bool:
        """No token configured: nothing may change."""
        return self.token is None

    def _mac(self, purpose: str, value: str = "") -> str:
        assert self.token is not None
        key = hmac.new(self._key, self.token.encode(), hashlib.sha256).digest()
        return hmac.new(key, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()

    def token_matches(self, given: str | None) -> bool:
        """Whether ``given`` is the configured token (constant time; ``False`` when read-only)."""
        if self.token is None or not given:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())

    def new_session(self) -> str:
        """A session cookie value: a random id and its MAC."""
        session = secrets.token_hex(16)
        return f"{session}.{self._mac('session', session)}"

    def session_of(self, request: Request) -> str | None:
        """The signed-in session id, or ``None``."""
        if self.token is None:
            return None
        cookie = request.cookies.get(SESSION_COOKIE, "")
        session, _, mac = cookie.partition(".")
        if not session or not mac or not hmac.compare_digest(mac, self._mac("session", session)):
            return None
        return session

    def csrf_for(self, request: Request) -> str | None:
        """The CSRF token forms carry for this request's session (``None``: not signed in)."""
        session = self.session_of(request)
        return None if session is None else self._mac("csrf", session)

    def bearer_ok(self, request: Request) -> bool:
        """``Authorization: Bearer TOKEN`` with the configured token."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(given.strip())

    def same_origin(self, request: Request) -> bool:
        """``Origin`` (or, failing it, ``Referer``) names this very host; absent both, a browser
        did not send the request cross-site (browsers send Origin on every cross-site POST)."""
        origin = request.headers.get("origin") or request.headers.get("referer")
        if not origin:
            return True
        host = request.headers.get("host", "")
        return urlsplit(origin).netloc == host

    def form_ok(self, request: Request, csrf: str | None) -> bool:
        """A form post from a signed-in browser: session, CSRF token and origin all hold."""
        expected = self.csrf_for(request)
        return (expected is not None and csrf is not None and hmac.compare_digest(csrf, expected)
                and self.same_origin(request))
