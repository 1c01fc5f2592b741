"""Settings: the database comes from SHOP_DATABASE_URL (sqlite:///FILE or postgresql://...)."""

import json
import os
from urllib.parse import unquote, urlsplit

SECRET_KEY = "test-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "ultimat3.contrib.django",
    "shop",
]
ROOT_URLCONF = "djproject.urls"
ALLOWED_HOSTS = ["testserver"]
MIDDLEWARE = ["ultimat3.contrib.django.middleware.RequestContextMiddleware"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def _database(url: str) -> dict[str, object]:
    if url.startswith("sqlite:///"):
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": url[len("sqlite:///"):]}
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


DATABASES = {"default": _database(os.environ["SHOP_DATABASE_URL"])}
ULTIMAT3 = {"ENV": os.environ.get("SHOP_ENV", "production"), "ACTOR": "shop.tenancy.actor_for"}
# Tests swap in bad settings to see them refused.
ULTIMAT3.update(json.loads(os.environ.get("SHOP_ULTIMAT3", "{}")))
