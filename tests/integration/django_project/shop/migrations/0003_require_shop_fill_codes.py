from django.db import migrations

from ultimat3.contrib.django.operations import RequireBackfill


class Migration(migrations.Migration):
    dependencies = [("shop", "0002_order_code")]
    operations = [RequireBackfill("shop.fill_codes")]
