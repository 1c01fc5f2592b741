"""settings.ULTIMAT3["ACTOR"]: who a request acts for (here: the X-Org header)."""

from typing import Any

from ultimat3 import Actor


def actor_for(request: Any) -> Actor | None:
    org = request.headers.get("X-Org")
    return Actor(id=f"web:{org}", org_id=org) if org else None
