from django import forms
from django.conf import settings
from django.template.defaultfilters import filesizeformat

from apps.core.files import FileImportError, detect_format

from .importers import FORMATS, FieldMapping
from .services import DEFAULT_REWARD_FN, DEFAULT_WORKFLOW, check_new_taskset_name


class TasksetUploadForm(forms.Form):
    file = forms.FileField(help_text="JSONL (one object per line), CSV with a header row, or Parquet; UTF-8.")
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
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    default_workflow = forms.CharField(max_length=100, initial=DEFAULT_WORKFLOW)
    default_reward_fn = forms.CharField(max_length=100, initial=DEFAULT_REWARD_FN)

    def clean_file(self):
        upload = self.cleaned_data["file"]
        limit = settings.TASKSET_UPLOAD_MAX_BYTES
        if upload.size > limit:
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
        if cleaned.get("format") == "auto" and cleaned.get("file"):
            try:
                cleaned["format"] = detect_format(cleaned["file"].name)
            except FileImportError:
                self.add_error(
                    "format", f"Cannot tell the format of {cleaned['file'].name!r} from its extension; choose one."
                )
        return cleaned

    @property
    def mapping(self) -> FieldMapping:
        data = self.cleaned_data
        return FieldMapping(
            data["prompt_field"], data["answer_field"], data["metadata_fields"], data["difficulty_field"] or None
        )
