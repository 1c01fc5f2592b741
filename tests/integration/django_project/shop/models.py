"""Orders."""

from django.db import models


class Order(models.Model):
    """An order; ``code`` was added later and is filled by the ``shop.fill_codes`` backfill."""

    email = models.CharField(max_length=200)
    code = models.CharField(max_length=20)
    shipped = models.BooleanField(default=False)
