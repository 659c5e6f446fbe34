from django.db import migrations, models


class Migration(migrations.Migration):
    """What a worker's machine has, for the launch's memory and rank checks (#41, findings 3, 15)."""

    dependencies = [
        ("runs", "0009_run_queued_tasks"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="memory_gb",
            field=models.FloatField(blank=True, help_text="the memory its processes may use", null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="cpus",
            field=models.PositiveIntegerField(blank=True, help_text="the cores its processes may use", null=True),
        ),
    ]
