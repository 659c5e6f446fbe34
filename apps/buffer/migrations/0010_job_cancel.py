"""Jobs are cancelled, not deleted, while they run (#41, apps.core.jobs.cancel_job): a cancel request a
running job sees at its next safe point, and the status it ends with."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('buffer', '0009_experience_token_arrays_uncompressed'),
    ]

    operations = [
        migrations.AddField(
            model_name='bufferjob',
            name='cancel_requested_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='bufferjob',
            name='status',
            field=models.CharField(choices=[('pending', 'Pending'), ('running', 'Running'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='pending', max_length=10),
        ),
    ]
