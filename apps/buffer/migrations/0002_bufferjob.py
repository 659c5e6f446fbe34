import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

import apps.buffer.fields
import apps.buffer.models


class Migration(migrations.Migration):
    dependencies = [("buffer", "0001_initial"), migrations.swappable_dependency(settings.AUTH_USER_MODEL)]

    operations = [
        migrations.CreateModel(
            name="BufferJob",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("import", "Import"),
                            ("export", "Export"),
                            ("rescore", "Rescore"),
                            ("promote", "Promote"),
                            ("pipeline", "Pipeline"),
                        ],
                        max_length=10,
                    ),
                ),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("pending", "Pending"),
                            ("running", "Running"),
                            ("succeeded", "Succeeded"),
                            ("failed", "Failed"),
                        ],
                        default="pending",
                        max_length=10,
                    ),
                ),
                (
                    "params",
                    models.JSONField(
                        blank=True, default=dict, help_text="what the job does: format, reward fn, operator"
                    ),
                ),
                (
                    "selection",
                    apps.buffer.fields.PackedArrayField(
                        dtype="<i8", help_text="ids of the selected rows, in the order they are processed"
                    ),
                ),
                (
                    "upload",
                    models.FileField(
                        blank=True,
                        help_text="deleted once the import has finished",
                        upload_to=apps.buffer.models._job_file_path,
                    ),
                ),
                ("original_filename", models.CharField(blank=True, max_length=255)),
                (
                    "output",
                    models.FileField(
                        blank=True, help_text="the export file", upload_to=apps.buffer.models._job_file_path
                    ),
                ),
                ("rows_done", models.PositiveBigIntegerField(default=0)),
                ("rows_total", models.PositiveBigIntegerField(default=0)),
                ("bytes_done", models.PositiveBigIntegerField(default=0)),
                ("bytes_total", models.PositiveBigIntegerField(default=0)),
                (
                    "result",
                    models.JSONField(
                        blank=True, default=dict, help_text="what the job did: rows changed, added, rejected"
                    ),
                ),
                ("error", models.TextField(blank=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                (
                    "created_by",
                    models.ForeignKey(
                        blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, to=settings.AUTH_USER_MODEL
                    ),
                ),
            ],
            options={"ordering": ["-created_at"]},
        )
    ]
