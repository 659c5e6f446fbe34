"""The sample order counts a row's priority as uses it has not had (workers.rft.sampling.sample_key):
the sample-order index is on the same expression, so the trainer's sample still reads the index in
order (256 rows of 10^6 without it: ~20 s). The admin's priority was stored and sampled by nothing."""
import django.db.models.expressions
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('buffer', '0011_experience_claimed_by'),
        ('runs', '0017_worker_usage'),
        ('tasksets', '0005_task_run_draws'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='experience',
            name='experience_sample_order',
        ),
        migrations.AddIndex(
            model_name='experience',
            index=models.Index(models.F('run'), django.db.models.expressions.CombinedExpression(models.F('use_count'), '-', models.F('priority')), models.F('explorer_step'), models.F('id'), condition=models.Q(('status', 'ready')), name='experience_sample_order'),
        ),
    ]
