from django.db import migrations, models

from apps.runs.models import new_secret


def give_each_run_its_own(apps, schema_editor):
    """AddField gave every existing run the same secret (its default, called once): one each."""
    Run = apps.get_model("runs", "Run")
    for pk in Run.objects.values_list("pk", flat=True):
        Run.objects.filter(pk=pk).update(secret=new_secret())


class Migration(migrations.Migration):
    dependencies = [("runs", "0004_explorer_claims")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="secret",
            field=models.CharField(default=new_secret, editable=False, max_length=64),
        ),
        migrations.RunPython(give_each_run_its_own, migrations.RunPython.noop),
    ]
