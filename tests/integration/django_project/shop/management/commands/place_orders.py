"""Drives the view through Django's test client the ways a site would, and prints the
responses as JSON (the test checks the database afterwards)."""

import json
from typing import Any

from django.core.management.base import BaseCommand
from django.test import Client


class Command(BaseCommand):
    def handle(self, *args: Any, **options: Any) -> None:
        client = Client(headers={"X-Org": "acme"})
        placed: dict[str, Any] = {}
        for label, body, url in [
            ("atomic", {"email": "ann@example.com", "mode": "atomic"}, "/orders"),
            ("atomic_failed", {"email": "bob@example.com", "mode": "atomic", "fail": True}, "/orders"),
            ("on_commit", {"email": "cy@example.com", "mode": "on_commit"}, "/orders"),
            ("on_commit_failed", {"email": "di@example.com", "mode": "on_commit", "fail": True}, "/orders"),
            ("autocommit", {"email": "ed@example.com"}, "/orders/autocommit"),
        ]:
            response = client.post(url, json.dumps(body), content_type="application/json")
            placed[label] = {"status": response.status_code, **response.json()}
        self.stdout.write(json.dumps(placed))
