"""Experience.claimed_by: the run whose trainer holds a row, so its restart releases what it held
of other runs' rows (their human edits) and none that another run holds. A row claimed before this
migration was claimed by its own run: the only rows a restart released then."""
from django.db import migrations, models
from django.db.models import F


def claimed_by_their_run(apps, schema_editor):
    Experience = apps.get_model("buffer", "Experience")
    Experience.objects.filter(claimed_at__isnull=False).update(claimed_by=F("run_id"))


class Migration(migrations.Migration):

    dependencies = [
        ("buffer", "0010_job_cancel"),
    ]

    operations = [
        migrations.AddField(
            model_name="experience",
            name="claimed_by",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(claimed_by_their_run, migrations.RunPython.noop),
    ]
