from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from apps.buffer import expert_import, importers
from apps.core.files import FileImportError


class Command(BaseCommand):
    help = ("Import a JSONL or Parquet file of expert data into an expert dataset (all rows or none), which a run "
            "trains on by naming it as buffer.expert_dataset (docs/data-formats.md).")

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument("--dataset", help="a new dataset (with --append, one of the same layout may be added "
                                              "to); default: the file's name without its extension")
        parser.add_argument("--append", action="store_true",
                            help="add the rows to the dataset if it exists (a file imported twice is there twice); "
                                 "without it, a dataset of that name is refused")
        parser.add_argument("--layout", choices=importers.LAYOUTS, default="sft",
                            help="sft: prompt + response, or chat messages; dpo: prompt + chosen + rejected")
        parser.add_argument("--format", choices=importers.FORMATS, help="default: from the file's extension")
        parser.add_argument("--user", help="the username whose preferences a DPO file's pairs become (dpo: required)")

    def handle(self, *args, **options):
        user = None
        if options["user"]:
            user = get_user_model().objects.filter(username=options["user"]).first()
            if user is None:
                raise CommandError(f"no user named {options['user']!r}")
        with tqdm(total=0, unit="B", unit_scale=True, desc=options["dataset"] or options["file"],
                  disable=options["verbosity"] == 0) as bar:

            def show_progress(rows, bytes_done, bytes_total):
                bar.total = bytes_total
                bar.update(bytes_done - bar.n)
                bar.set_postfix(rows=f"{rows:,}", refresh=False)

            try:
                imported = expert_import.import_expert_data(
                    options["file"], dataset=options["dataset"], append=options["append"], layout=options["layout"],
                    fmt=options["format"], user=user, progress=show_progress,
                )
            except FileImportError as exc:
                raise CommandError(str(exc)) from None
        said = str(imported)
        self.stdout.write(self.style.SUCCESS(f"{said[0].upper()}{said[1:]}."))
