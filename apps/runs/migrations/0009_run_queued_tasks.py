from django.db import migrations, models


class Migration(migrations.Migration):
    """At most one queued serve_duty task per duty (#41): the task sent for each duty not taken yet."""

    dependencies = [
        ('runs', '0008_run_buffer_retired'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='queued_tasks',
            field=models.JSONField(blank=True, default=dict, editable=False),
        ),
    ]
