import django.db.models.functions.text
from django.db import migrations, models


def refuse_names_differing_in_case(apps, schema_editor):
    """The constraint cannot be made over two models whose names differ in case only (a race the
    code's check let through before it): say which, rather than the database's bare IntegrityError.
    Renaming one of them (the Models page, PATCH /api/models/<name>/) lets the migration through."""
    names = {}
    for name in apps.get_model("saved_models", "SavedModel").objects.values_list("name", flat=True):
        names.setdefault(name.lower(), []).append(name)
    clashes = [" and ".join(sorted(group)) for group in names.values() if len(group) > 1]
    if clashes:
        raise RuntimeError(f"saved models whose names differ in case only: {'; '.join(clashes)}. Rename one of each "
                           "(names that differ in case only are one name) and migrate again.")


class Migration(migrations.Migration):

    dependencies = [
        ('saved_models', '0002_renames_and_aliases'),
    ]

    operations = [
        migrations.RunPython(refuse_names_differing_in_case, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='savedmodel',
            constraint=models.UniqueConstraint(django.db.models.functions.text.Lower('name'),
                                               name='saved_model_name_unique_any_case'),
        ),
    ]
