"""Jobs are cancelled, not deleted, while they run (#41, apps.core.jobs.cancel_job): a cancel request a
running job sees at its next safe point, and the status it ends with."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tasksets', '0003_tasksetimport_rows_total'),
    ]

    operations = [
        migrations.AddField(
            model_name='tasksetimport',
            name='cancel_requested_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='tasksetimport',
            name='status',
            field=models.CharField(choices=[('pending', 'Pending'), ('running', 'Running'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='pending', max_length=10),
        ),
    ]
