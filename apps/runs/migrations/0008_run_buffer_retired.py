from django.db import migrations, models


class Migration(migrations.Migration):
    """Buffer retention (#29): when and how an ended run's buffer was archived or dropped."""

    dependencies = [
        ('runs', '0007_run_notes_tags'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='buffer_retired_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='buffer_retirement',
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
