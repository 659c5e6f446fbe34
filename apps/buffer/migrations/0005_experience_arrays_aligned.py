"""One representation for token arrays, which the engine's Experience now checks where it is built.

- Human edits were stored with empty logprobs (b"") instead of none (NULL): the trainer read them as
  present and failed to collate them beside the response they replace. A person's text has no
  generation logprobs, so every human edit gets NULL.
- Imported rows could have response_ids and no action_mask; every token of such a response is
  its own, so the mask is all ones.
"""
from django.db import migrations

BATCH = 1000


def align(apps, schema_editor):
    Experience = apps.get_model("buffer", "Experience")
    Experience.objects.filter(source="human_edit").update(logprobs=None)
    unmasked = Experience.objects.filter(action_mask__isnull=True, response_ids__isnull=False).only("response_ids")
    batch = []
    for row in unmasked.iterator(chunk_size=BATCH):
        row.action_mask = [1] * len(row.response_ids)
        batch.append(row)
        if len(batch) == BATCH:
            Experience.objects.bulk_update(batch, ["action_mask"])
            batch = []
    Experience.objects.bulk_update(batch, ["action_mask"])


class Migration(migrations.Migration):
    dependencies = [("buffer", "0004_experience_sample_order")]
    operations = [migrations.RunPython(align, migrations.RunPython.noop)]
