"""Buffer retention (#29): a BufferJob kind that archives or drops the experiences of ended runs
(apps/buffer/retention.py); its archive is the job's `output`, as an export's file is."""
import apps.buffer.models
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('buffer', '0006_experience_claims_stay_hot'),
    ]

    operations = [
        migrations.AlterField(
            model_name='bufferjob',
            name='kind',
            field=models.CharField(choices=[('import', 'Import'), ('export', 'Export'), ('rescore', 'Rescore'), ('promote', 'Promote'), ('pipeline', 'Pipeline'), ('retention', 'Retention')], max_length=10),
        ),
        migrations.AlterField(
            model_name='bufferjob',
            name='output',
            field=models.FileField(blank=True, help_text='the export or archive file', upload_to=apps.buffer.models._job_file_path),
        ),
    ]
