# TasksetImport became an apps.core Job, whose progress counts include rows_total (set when the
# import ends: the file's row count is not known before). Existing rows get 0.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasksets", "0002_taskset_import"),
    ]

    operations = [
        migrations.AddField(
            model_name="tasksetimport",
            name="rows_total",
            field=models.PositiveBigIntegerField(default=0),
        ),
    ]
