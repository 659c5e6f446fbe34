from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from apps.core.files import FileImportError
from apps.tasksets.importers import FORMATS, FieldMapping
from apps.tasksets.services import (
    DEFAULT_REWARD_FN,
    DEFAULT_WORKFLOW,
    check_new_taskset_name,
    import_taskset,
)


class Command(BaseCommand):
    help = "Import a JSONL, CSV or Parquet file as a new taskset (all rows or none)."

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument("--name", required=True, help="name of the new taskset (a slug)")
        parser.add_argument("--format", choices=FORMATS, help="default: from the file's extension")
        parser.add_argument(
            "--prompt-field",
            default="prompt",
            help="column or key holding the prompt (text or chat messages); default: prompt",
        )
        parser.add_argument(
            "--answer-field", default="answer", help="column or key holding the ground-truth answer; default: answer"
        )
        parser.add_argument(
            "--metadata-field",
            action="append",
            default=[],
            dest="metadata_fields",
            help="column or key copied into the task's metadata (repeatable)",
        )
        parser.add_argument("--difficulty-field", help="numeric column or key for the task's difficulty")
        parser.add_argument("--description", default="")
        parser.add_argument("--workflow", default=DEFAULT_WORKFLOW, help="default workflow of runs on this taskset")
        parser.add_argument("--reward-fn", default=DEFAULT_REWARD_FN, help="default reward function")
        parser.add_argument("--batch-size", type=int, help="tasks per committed batch (default: settings, 500)")
        parser.add_argument("--max-line-bytes", type=int, help="reject longer lines (default: settings, 1 MiB)")

    def handle(self, *args, **options):
        mapping = FieldMapping(
            prompt=options["prompt_field"],
            answer=options["answer_field"],
            metadata=options["metadata_fields"],
            difficulty=options["difficulty_field"],
        )
        try:  # before the progress bar: a taken name is reported alone, not under an empty bar
            check_new_taskset_name(options["name"], Path(options["file"]).name)
        except FileImportError as exc:
            raise CommandError(str(exc)) from None
        with tqdm(total=0, unit="B", unit_scale=True, desc=options["name"], disable=options["verbosity"] == 0) as bar:

            def show_progress(progress):
                bar.total = progress.bytes_total
                bar.update(progress.bytes_done - bar.n)
                bar.set_postfix(rows=f"{progress.rows_done:,}", refresh=False)

            try:
                taskset = import_taskset(
                    options["file"],
                    name=options["name"],
                    fmt=options["format"],
                    mapping=mapping,
                    description=options["description"],
                    default_workflow=options["workflow"],
                    default_reward_fn=options["reward_fn"],
                    progress=show_progress,
                    batch_size=options["batch_size"],
                    max_line_bytes=options["max_line_bytes"],
                )
            except FileImportError as exc:
                raise CommandError(str(exc)) from None
        self.stdout.write(self.style.SUCCESS(f"Imported {taskset.task_count:,} tasks into taskset {taskset.name!r}."))
