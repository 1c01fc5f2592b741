from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("shop", "0003_require_shop_fill_codes")]
    operations = [migrations.AlterField("order", "code", models.CharField(max_length=20))]
