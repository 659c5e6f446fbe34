"""Each run's summary of its metrics (MetricSummary, apps/runs/summaries.py), made for the runs
there are from their points, each read once as the write path reads a new point
(summaries.numbers): the 808,200 points of bench/runs_table.py took 45-78 s on a shared 2-core
machine (load 7-10), 55-95 µs a point."""
import django.db.models.deletion
from django.db import migrations, models


def fill(apps, schema_editor):
    from apps.runs.summaries import rebuild

    rebuild(apps.get_model("runs", "MetricPoint"), apps.get_model("runs", "MetricSummary"))


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0019_run_list_columns'),
    ]

    operations = [
        migrations.CreateModel(
            name='MetricSummary',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('role', models.CharField(choices=[('explorer', 'Explorer'), ('trainer', 'Trainer'), ('eval', 'Eval'), ('system', 'System')], max_length=10)),
                ('key', models.CharField(max_length=200)),
                ('latest', models.FloatField()),
                ('latest_step', models.PositiveIntegerField()),
                ('min', models.FloatField()),
                ('max', models.FloatField()),
                ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='metric_summaries', to='runs.run')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('role', 'key', 'run'), name='metric_summary_unique')],
            },
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),  # back: the table goes, and its rows
    ]
