"""Imported expert data comes in named datasets that a run names as buffer.expert_dataset and
trains on (before, no run read imported rows). Rows imported before this migration go into two
datasets: `imported` (SFT rows) and `imported-pairs` (the DPO imports' `pair-…` groups)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def group_imported_rows(apps, schema_editor):
    Experience = apps.get_model("buffer", "Experience")
    ExpertDataset = apps.get_model("buffer", "ExpertDataset")
    imported = Experience.objects.filter(run__isnull=True, source="expert", dataset__isnull=True)
    pairs = imported.filter(group_id__startswith="pair-")
    for name, layout, rows in (("imported-pairs", "dpo", pairs), ("imported", "sft", imported)):
        if rows.exists():
            rows.update(dataset=ExpertDataset.objects.create(name=name, layout=layout))


class Migration(migrations.Migration):

    dependencies = [
        ('buffer', '0012_sample_order_priority'),
        ('runs', '0018_report_chart_smoothing'),
        ('tasksets', '0005_task_run_draws'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='ExpertDataset',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100, unique=True)),
                ('layout', models.CharField(choices=[('sft', 'SFT: prompt and response'), ('dpo', 'DPO: prompt, chosen and rejected')], max_length=3)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.AddField(
            model_name='experience',
            name='dataset',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='experiences', to='buffer.expertdataset'),
        ),
        migrations.RunPython(group_imported_rows, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name='experience',
            index=models.Index(condition=models.Q(('dataset__isnull', False)), fields=['dataset', 'id'], name='experience_dataset'),
        ),
    ]
