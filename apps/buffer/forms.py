"""Forms of the curation admin: the options of bulk actions, and the expert data upload."""

from django import forms
from django.conf import settings
from django.template.defaultfilters import filesizeformat

from apps.core.files import FileImportError
from apps.runs.config_checks import checked_reward_fn
from workers.rft.config import ConfigError, parse_config_text, parse_reward_fn_text

from . import curation, expert_import, exporters, importers
from .models import ExpertDataset


class PriorityForm(forms.Form):
    priority = forms.FloatField(
        help_text="Higher-priority experiences are preferred where a sample strategy uses priority."
    )


class ExportForm(forms.Form):
    format = forms.ChoiceField(
        choices=[(fmt, fmt) for fmt in exporters.FORMATS],
        help_text="Both hold every field and import back as expert data; see docs/data-formats.md.",
    )


class RescoreForm(forms.Form):
    reward_fn = forms.CharField(
        label="Reward fn",
        max_length=2000,
        help_text="A reward fn name, e.g. exact_match, or a mapping of names to weights, e.g. "
        '{"exact_match": 0.9, "format": 0.1}, as a run config\'s explorer.reward_fn.',
    )

    def clean_reward_fn(self):
        """The spec as a launch reads and checks explorer.reward_fn, its models resolved."""
        try:
            return checked_reward_fn(parse_reward_fn_text(self.cleaned_data["reward_fn"]))
        except ConfigError as exc:
            raise forms.ValidationError(_messages(exc)) from None


class PipelineForm(forms.Form):
    operator = forms.ChoiceField(help_text="An experience pipeline operator, as a run config names it.")
    params = forms.CharField(
        required=False,
        max_length=2000,
        help_text='Its parameters as a JSON object, e.g. {"min": 0.5} for reward_filter; empty for none.',
    )

    def __init__(self, *args, **kwargs):
        from workers.rft.pipelines import EXPERIENCE_OPERATORS  # imports torch: only when the form is used

        super().__init__(*args, **kwargs)
        self.fields["operator"].choices = [(name, name) for name in EXPERIENCE_OPERATORS.names()]

    def clean_params(self):
        text = self.cleaned_data["params"].strip()
        if not text:
            return {}
        if not text.startswith("{"):
            raise forms.ValidationError("the parameters must be a JSON object")
        try:
            return parse_config_text(text)  # as a run config's are read: 1,000 `[` were a RecursionError here
        except ConfigError as exc:
            raise forms.ValidationError(_messages(exc)) from None

    def clean(self):
        cleaned = super().clean()
        if "operator" in cleaned and "params" in cleaned:
            try:
                curation.check_operator(cleaned["operator"], cleaned["params"])
            except ConfigError as exc:
                self.add_error("params", _messages(exc))
        return cleaned


class ExpertDataUploadForm(forms.Form):
    file = forms.FileField(help_text="JSONL (one object per line) or Parquet, UTF-8.")
    dataset = forms.CharField(
        max_length=100, required=False,
        help_text="What a run names as buffer.expert_dataset to train on these rows: a new name (or, ticking "
        "below, an existing dataset of the same layout). Empty: the file's name without its extension.",
    )
    append = forms.BooleanField(
        required=False, label=expert_import.APPEND_LABEL,
        help_text="Ticked, a dataset of this name gets this file's rows after its own (a file imported twice is "
        "there twice); unticked, the import makes a new dataset, and a name that is taken is refused.",
    )
    layout = forms.ChoiceField(
        choices=[
            ("sft", "SFT: prompt + response (or completion), or chat messages (an rftweb experience export too)"),
            ("dpo", "DPO: prompt + chosen + rejected, or chat chosen + rejected sharing their prompt turns"),
        ],
        initial="sft",
    )
    format = forms.ChoiceField(
        choices=[("auto", "from the file extension"), *((f, f) for f in importers.FORMATS)], initial="auto"
    )

    def clean_file(self):
        upload = self.cleaned_data["file"]
        limit = settings.TASKSET_UPLOAD_MAX_BYTES  # the one upload limit of the project
        if upload.size > limit:
            raise forms.ValidationError(
                f"The file is {filesizeformat(upload.size)}; uploads are limited to {filesizeformat(limit)}."
            )
        return upload

    def clean(self):
        cleaned = super().clean()
        upload = cleaned.get("file")
        if upload and not cleaned.get("dataset", "").strip():
            cleaned["dataset"] = expert_import.default_dataset_name(upload.name)
        name, layout = cleaned.get("dataset", "").strip(), cleaned.get("layout")
        if name and "\x00" in name:
            self.add_error("dataset", "A dataset name cannot hold a NUL character.")
        elif name and (importing := expert_import.being_imported(name)):
            self.add_error("dataset", importing[0].upper() + importing[1:] + ".")
        elif name and layout and (existing := ExpertDataset.objects.filter(name=name).first()):
            if existing.layout != layout:
                self.add_error("dataset", f"The dataset {name!r} holds the other layout's data: name another one.")
            elif not cleaned.get("append"):
                how = f"tick “{expert_import.APPEND_LABEL}” to add this file's rows to it."
                problem = expert_import.taken(existing, expert_import.dataset_size(existing), how)
                self.add_error("dataset", problem[0].upper() + problem[1:])
        if cleaned.get("format") == "auto" and upload:
            try:
                cleaned["format"] = importers.detect_expert_format(cleaned["file"].name)
            except FileImportError as exc:
                self.add_error("format", exc.message)
        return cleaned


def _messages(error: ConfigError) -> list[str]:
    return [issue.message if issue.key == "<config>" else f"{issue.key}: {issue.message}" for issue in error.errors]
