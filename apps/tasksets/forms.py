from django import forms
from django.conf import settings
from django.template.defaultfilters import filesizeformat

from apps.core.files import FileImportError
from workers.rft.rewards import REWARD_FNS
from workers.rft.workflows import WORKFLOWS

from . import staging
from .importers import FORMATS, FieldMapping, detect_task_format
from .models import Taskset
from .services import DEFAULT_REWARD_FN, DEFAULT_WORKFLOW, check_new_taskset_name


class TasksetUploadForm(forms.Form):
    """The upload page's form. After an error the file sent is kept (apps.tasksets.staging): the page
    names it and the next submit uses it unless another file is chosen."""

    file = forms.FileField(
        required=False,  # when a file kept from the last submit is used; clean() requires one of the two
        help_text="JSONL (one object per line), CSV with a header row, or Parquet; UTF-8.",
    )
    staged = forms.CharField(required=False, widget=forms.HiddenInput)
    name = forms.SlugField(max_length=100, help_text="Name of the new taskset: letters, digits, - and _.")
    format = forms.ChoiceField(
        choices=[("auto", "from the file extension"), *((f, f) for f in FORMATS)], initial="auto"
    )
    prompt_field = forms.CharField(
        max_length=200,
        initial="prompt",
        help_text="Column or key of the prompt: text, or a list of chat messages {role, content}.",
    )
    answer_field = forms.CharField(
        max_length=200, initial="answer", help_text="Column or key of the ground-truth answer."
    )
    metadata_fields = forms.CharField(
        max_length=2000, required=False, help_text="Columns or keys copied into each task's metadata, comma-separated."
    )
    difficulty_field = forms.CharField(max_length=200, required=False, help_text="Numeric column or key (optional).")
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False,
                                  max_length=Taskset.MAX_DESCRIPTION)
    default_workflow = forms.ChoiceField(
        choices=[(name, name) for name in WORKFLOWS], initial=DEFAULT_WORKFLOW,
        help_text="How a run rolls a task out, unless its config says otherwise (docs/agents.md).",
    )
    default_reward_fn = forms.ChoiceField(
        choices=[(name, name) for name in REWARD_FNS], initial=DEFAULT_REWARD_FN,
        help_text="How a response is scored, unless the run's config says otherwise.",
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        self.kept: staging.Staged | None = None  # the file kept from an earlier submit, when used

    @property
    def upload(self):
        """The file to import: the one sent now, else the kept one (open it once)."""
        return self.cleaned_data["file"] or self.kept.open()

    def clean_file(self):
        upload = self.cleaned_data["file"]
        limit = settings.TASKSET_UPLOAD_MAX_BYTES
        if upload and upload.size > limit:
            raise forms.ValidationError(
                f"The file is {filesizeformat(upload.size)}; uploads are limited to {filesizeformat(limit)}."
            )
        return upload

    def clean_name(self):
        name = self.cleaned_data["name"]
        try:
            check_new_taskset_name(name)
        except FileImportError as exc:
            raise forms.ValidationError(exc.message) from None
        return name

    def clean_metadata_fields(self):
        return [f.strip() for f in self.cleaned_data["metadata_fields"].split(",") if f.strip()]

    def clean(self):
        cleaned = super().clean()
        if not cleaned.get("file") and "file" not in self.errors:
            self.kept = staging.find(cleaned.get("staged", ""), self.user)
            if self.kept is None:
                self.add_error("file", "The file chosen earlier is no longer kept; choose it again."
                               if cleaned.get("staged") else "Choose a file to upload.")
        file_name = cleaned["file"].name if cleaned.get("file") else self.kept.name if self.kept else None
        if cleaned.get("format") == "auto" and file_name:
            try:
                cleaned["format"] = detect_task_format(file_name)
            except FileImportError:
                self.add_error("format", f"Cannot tell the format of {file_name!r} from its extension; choose one.")
        return cleaned

    @property
    def mapping(self) -> FieldMapping:
        data = self.cleaned_data
        return FieldMapping(
            data["prompt_field"], data["answer_field"], data["metadata_fields"], data["difficulty_field"] or None
        )
