"""Forms of the run pages: the launch form over the run config, and the list / rollout filters.

The launch form edits one config in one of two editors. In the form editor each knob is a field
named by its dotted config key (`algorithm.kl.coef`), so a ConfigError issue lands next to its
field; the whole config rides along as JSON in `base`, so keys without a field (pipelines, system
prompt, ...) survive. In the YAML editor the text is the config. Every text here (the YAML box,
`base`, the reward_fn field) is read by the engine's one reader, parse_config_text, and the config
the form puts together is a bounded JSON value before anything renders or dumps it. Switching
editors carries the config over; launching validates it with the services (workers.rft.config
plus the tasksets and model directories).
"""

import json
from collections.abc import Mapping

import yaml
from django import forms
from django.contrib.auth import get_user_model
from django.db.models import Q

from apps.buffer.models import Experience, ExpertDataset
from apps.core.numbers import ids_sent
from apps.saved_models.models import SavedModel
from apps.tasksets.models import Taskset
from workers.rft.config import (
    ConfigError,
    ConfigIssue,
    RunConfig,
    check_config_value,
    parse_config_text,
    parse_reward_fn_text,
)
from workers.rft.config_issues import accepts_null, choices_of, description, leaf_types, section_of
from workers.rft.config_rules import TRAINER_ONLY
from workers.rft.config_text import ConfigDumper

from . import notes, run_columns, sweeps
from .config_keys import get_key, reset_unread, set_key
from .models import Report, Run, Sweep

FORM, YAML = "form", "yaml"

# Fields the form shows, by section; every other key is edited in the YAML box.
SECTIONS = (
    ("Run", ("mode", "seed")),
    ("Model", ("model.path", "model.dtype", "model.device")),
    (
        "Data",
        ("buffer.taskset", "buffer.expert_taskset", "buffer.expert_dataset", "buffer.eval_taskset",
         "buffer.max_staleness"),
    ),
    (
        "Algorithm",
        (
            "algorithm.name",
            "algorithm.policy_loss",
            "algorithm.repeat_times",
            "algorithm.clip_range",
            "algorithm.clip_ratio_c",
            "algorithm.loss_agg_mode",
            "algorithm.entropy_coef",
            "algorithm.drop_zero_std_groups",
            "algorithm.kl.fn",
            "algorithm.kl.coef",
            "algorithm.mix.mu",
            "algorithm.mix.expert_data_ratio",
            "algorithm.dpo.beta",
            "algorithm.gae.gamma",
            "algorithm.gae.lam",
            "algorithm.rollout_correction.mode",
        ),
    ),
    (
        "Explorer",
        (
            "explorer.engine",
            "explorer.batch_size",
            "explorer.temperature",
            "explorer.top_p",
            "explorer.max_new_tokens",
            "explorer.workflow",
            "explorer.reward_fn",
            "explorer.eval_interval",
        ),
    ),
    (
        "Trainer",
        (
            "trainer.lr",
            "trainer.total_steps",
            "trainer.batch_size",
            "trainer.micro_batch_size",
            "trainer.save_interval",
            "trainer.grad_clip",
            "trainer.warmup_steps",
        ),
    ),
    ("Synchroniser", ("synchronizer.method", "synchronizer.interval", "synchronizer.offset")),
    ("Human feedback", ("feedback.reward_mode", "feedback.judgements_per_item", "feedback.require_review")),
    ("Scale", ("trainer.strategy", "trainer.num_processes", "trainer.num_nodes", "explorer.engine_num")),
)

# Knobs that matter for some algorithms only; the page hides them for the others.
RL = ("grpo", "ppo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opmd", "mix", "mix_chord")
CLIPPED = tuple(name for name in RL if name != "opmd")  # the presets whose loss clips the ratio
GROUPED = ("grpo", "rloo", "reinforce_plus_plus_baseline", "opmd", "mix", "mix_chord")  # group advantage fns
ALGORITHM_ONLY = {
    "buffer.expert_taskset": ("sft", "mix", "mix_chord"),  # the ones that train on expert data
    "buffer.expert_dataset": ("sft", "mix", "mix_chord", "dpo"),  # and on imported pairs
    "buffer.max_staleness": RL,  # the ones that train on rollouts
    "algorithm.loss_agg_mode": (*RL, "sft"),
    "algorithm.drop_zero_std_groups": GROUPED,
    "algorithm.mix.mu": ("mix",),
    "algorithm.mix.": ("mix", "mix_chord"),
    "algorithm.dpo.": ("dpo",),
    "algorithm.gae.gamma": ("ppo", "reinforce_plus_plus"),
    "algorithm.gae.": ("ppo",),
    "algorithm.clip_range": CLIPPED,
    "algorithm.clip_ratio_c": CLIPPED,
    "algorithm.repeat_times": RL,
    "algorithm.rollout_correction.": RL,
}

# Knobs only some modes read: what only a trainer reads (config_rules.TRAINER_ONLY), and the
# explorer's evaluation. The page hides them for the other modes, and a launch puts them back at
# their defaults there (the quick demo's trainer.lr and eval_interval were refused with mode
# explore picked, as set and read by nothing).
MODE_ONLY = {f"{section}.{key}": ("both", "train") for section, keys in TRAINER_ONLY.items() for key in keys}
MODE_ONLY["explorer.eval_interval"] = ("both", "bench")  # explore's weights never change; train runs no explorer

TASKSET_KEYS = ("buffer.taskset", "buffer.expert_taskset", "buffer.eval_taskset")


def dump_config_yaml(config: Mapping) -> str:
    """YAML in the schema's key order (Postgres' jsonb keeps no order)."""
    # libyaml's dumper where there is one: 0.03 s for a 10,000-node config against 0.13 (every run page);
    # ConfigDumper quotes what parse_config_text would read back as a number.
    return yaml.dump(_in_schema_order(config, default_config()), Dumper=ConfigDumper, sort_keys=False,
                     allow_unicode=True)


def _in_schema_order(config, schema):
    if not isinstance(config, Mapping):
        return config
    schema = schema if isinstance(schema, Mapping) else {}
    keys = [key for key in schema if key in config] + [key for key in config if key not in schema]
    return {key: _in_schema_order(config[key], schema.get(key)) for key in keys}


def default_config() -> dict:
    return RunConfig().to_dict()


class RewardFnField(forms.CharField):
    """explorer.reward_fn: a name, or a flow mapping of names to weights."""

    def prepare_value(self, value):
        if isinstance(value, Mapping):
            return yaml.dump(dict(value), Dumper=ConfigDumper, default_flow_style=True, sort_keys=False).strip()
        return value

    def to_python(self, value):
        try:
            return parse_reward_fn_text(super().to_python(value))
        except ConfigError as err:
            issue = err.errors[0]
            where = "" if issue.key == "<config>" else f"{issue.key}: "
            raise forms.ValidationError(
                f"{where}{issue.message} (write a name, or a mapping like {{exact_match: 1, format: 0.2}})"
            ) from None


def _schema_field(key: str):
    """The pydantic field of RunConfig at a dotted key."""
    model = RunConfig
    *sections, name = key.split(".")
    for part in sections:
        model = section_of(model.model_fields[part].annotation)
    return model.model_fields[name]


def _form_field(key: str, names: dict[str, list[str]]) -> forms.Field:
    """A form field that takes what the config key takes, with its description as help, read off
    the config schema so the two cannot drift; the ranges are left to the schema, whose messages
    then show next to the field. `names`: the choices of the keys that name a stored thing."""
    spec = _schema_field(key)
    types = leaf_types(spec.annotation)
    optional = accepts_null(spec.annotation)
    choices = names[key] if key in names else choices_of(spec.annotation) or None
    required = not optional and bool not in types  # an unchecked box is a value: false
    options = {"required": required, "label": key.split(".", 1)[-1], "help_text": description(spec)}
    if key == "explorer.reward_fn":
        field = RewardFnField(**options)
    elif choices is not None:
        blank = [("", "— none —")] if optional else []
        field = forms.TypedChoiceField(choices=blank + [(c, c) for c in choices], empty_value=None, **options)
    elif bool in types:
        field = forms.BooleanField(**options)
    elif int in types:
        field = forms.IntegerField(**options)
    elif float in types:
        field = forms.FloatField(widget=forms.NumberInput(attrs={"step": "any"}), **options)
    else:
        field = forms.CharField(empty_value=None, **options)
    field.algorithms = next((names for prefix, names in ALGORITHM_ONLY.items() if key.startswith(prefix)), ())
    field.modes = MODE_ONLY.get(key, ())
    if key == "model.path":
        from workers.rft.models import BUILTIN_MODELS

        saved = [model.model_path for model in SavedModel.objects.only("name").order_by("name")]
        field.suggestions = [*BUILTIN_MODELS, *saved]
        field.widget.attrs["list"] = "suggest-model-path"
    return field


class LaunchForm(forms.Form):
    name = forms.CharField(max_length=200, required=False, help_text="empty: named after the algorithm and taskset")
    editor = forms.ChoiceField(choices=[(FORM, FORM), (YAML, YAML)], widget=forms.HiddenInput)
    base = forms.CharField(widget=forms.HiddenInput, required=False)
    yaml = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 32, "spellcheck": "false", "class": "yaml"}), required=False, label="YAML"
    )

    # A sweep (apps/runs/sweeps.py): the config above as its base, these keys swept.
    sweep = forms.CharField(
        required=False, max_length=sweeps.MAX_TEXT, label="Sweep over",
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "class": "sweep-space",
                                     "placeholder": "trainer.lr: 1e-5, 3e-5, 1e-4\nalgorithm.kl.coef: 0, 0.01"}),
        help_text="a key a line: listed values (key: a, b, c), or for a random search a range "
                  "(key: 1e-6 .. 1e-4, linear, or key: 1e-6 .. 1e-4 log)",
    )
    sweep_method = forms.ChoiceField(choices=Sweep.Method.choices, initial=Sweep.Method.GRID, label="Search",
                                     required=False,
                                     help_text="grid: every combination · random: count draws")
    sweep_count = forms.IntegerField(min_value=1, max_value=sweeps.MAX_RUNS, initial=6, required=False,
                                     label="Runs", help_text=f"random search only; at most {sweeps.MAX_RUNS}")
    sweep_seed = forms.IntegerField(min_value=0, max_value=2**31 - 1, initial=0, required=False, label="Seed",
                                    help_text="random search only: the same seed draws the same runs")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.current_editor = (self.data.get("editor") if self.is_bound else self.initial.get("editor")) or FORM
        if self.current_editor == FORM:
            tasksets = list(Taskset.objects.values_list("name", flat=True))
            names = {key: tasksets for key in TASKSET_KEYS}
            names["buffer.expert_dataset"] = list(ExpertDataset.objects.values_list("name", flat=True))
            for _, keys in SECTIONS:
                for key in keys:
                    self.fields[key] = _form_field(key, names)

    @classmethod
    def for_config(cls, config: Mapping, *, name: str = "", editor: str = FORM) -> "LaunchForm":
        """An unbound form showing config; keys it lacks show their defaults."""
        defaults = default_config()
        initial = {"name": name, "editor": editor, "base": json.dumps(config), "yaml": dump_config_yaml(config)}
        for _, keys in SECTIONS:
            for key in keys:
                initial[key] = get_key(config, key, get_key(defaults, key))
        return cls(initial=initial)

    @property
    def sections(self):
        """(title, bound fields) for the template."""
        return [(title, [self[key] for key in keys]) for title, keys in SECTIONS]

    def clean(self):
        cleaned = super().clean()
        if self.has_error("yaml") or self.has_error("base"):  # a NUL, say: its own error says so
            return cleaned
        try:
            cleaned["config"] = self._config(cleaned)
        except ConfigError as err:
            self.add_config_errors(err)
        return cleaned

    def _config(self, cleaned) -> dict:
        if self.current_editor == YAML:
            if not cleaned.get("yaml", "").strip():  # it opens holding a config: cleared, by mistake
                raise ConfigError([ConfigIssue("<config>", "the YAML box is empty: write the run's config in it, "
                                                           "or start from a preset")])
            return parse_config_text(cleaned.get("yaml", ""))
        config = parse_config_text(cleaned.get("base") or "{}")  # the form's own JSON, which a client can rewrite
        for _, keys in SECTIONS:
            for key in keys:
                if key in cleaned:
                    set_key(config, key, cleaned[key])
        check_config_value(config)  # each part is bounded; together they must be too
        self._reset_hidden_unread(config)
        return config

    def _reset_hidden_unread(self, config: dict) -> None:
        """A field the page hides for the chosen algorithm or mode keeps its value while hidden, so
        picking that algorithm or mode again shows it; launched, it is the default where the config
        would not read it (the quick demo's expert taskset with grpo picked, its trainer.lr with mode
        explore)."""
        algorithm, mode = get_key(config, "algorithm.name", None), get_key(config, "mode", None)
        reset_unread(config, [key for key, field in self.fields.items()
                              if (getattr(field, "algorithms", ()) and algorithm not in field.algorithms)
                              or (getattr(field, "modes", ()) and mode not in field.modes)])

    def sweep_space(self) -> list:
        """The sweep's axes as the API takes them (SweepError names what is wrong)."""
        return [axis.to_json() for axis in sweeps.parse_space(self.cleaned_data.get("sweep", ""))]

    def add_sweep_errors(self, error) -> None:
        """A sweep's problems: its space's next to its box, a config's as a launch's are."""
        own = [issue for issue in error.errors
               if not error.of_configs or issue.key == "sweep" or not self._has_field(issue.key)]
        for issue in own:
            self.add_error("sweep", issue.message if issue.key == "sweep" else f"{issue.key}: {issue.message}")
        rest = [issue for issue in error.errors if issue not in own]
        if rest:
            self.add_config_errors(ConfigError(rest))

    def _has_field(self, key: str) -> bool:
        return self.current_editor == YAML or any(key == name or key.startswith(f"{name}.") for name in self.fields)

    def run_name(self) -> str:
        config = self.cleaned_data["config"]
        return (
            self.cleaned_data.get("name")
            or (f"{get_key(config, 'algorithm.name', 'grpo')} on {get_key(config, 'buffer.taskset', 'arithmetic')}")[
                :200
            ]
        )

    def add_config_errors(self, error) -> None:
        """Each ConfigError issue next to its field, or the field whose value holds its key
        (explorer.reward_fn.llm_judge.rubric by explorer.reward_fn); others at the top (or by the
        YAML box)."""
        for issue in error.errors:
            field = next(
                (key for key in self.fields if issue.key == key or issue.key.startswith(f"{key}.")), None
            ) if self.current_editor == FORM else None
            if field is None:
                where = "" if issue.key == "<config>" else f"{issue.key}: "
                self.add_error("yaml" if self.current_editor == YAML else None, where + issue.message)
            else:
                inside = issue.key.removeprefix(field).removeprefix(".")
                self.add_error(field, f"{inside}: {issue.message}" if inside else issue.message)

    def field_problems(self) -> list[tuple]:
        """(bound field, error) for each error beside a field, in the page's order: listed at the top,
        by the Launch button (an error by a field far down the page went unseen)."""
        return [(field, error) for field in self for error in field.errors]

    def switched(self) -> "LaunchForm":
        """The same config and name in the other editor (call on a valid form)."""
        other = YAML if self.current_editor == FORM else FORM
        switched = LaunchForm.for_config(self.cleaned_data["config"], name=self.cleaned_data.get("name", ""),
                                         editor=other)
        for key in ("sweep", "sweep_method", "sweep_count", "sweep_seed"):
            if self.cleaned_data.get(key) not in (None, ""):
                switched.initial[key] = self.cleaned_data[key]
        return switched


class ConditionsField(forms.Field):
    """The ?where= filters, as many as sent (an empty one, the form's blank box, left out): a
    list of run_columns.Condition; each bad one named (the table's columns, or the syntax)."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value):
        return [text for text in (value or []) if isinstance(text, str) and text.strip()]

    def clean(self, value):
        texts = self.to_python(value)
        if len(texts) > run_columns.MAX_CONDITIONS:
            raise forms.ValidationError(f"{len(texts)} filters: at most {run_columns.MAX_CONDITIONS}")
        conditions, problems = [], []
        for text in texts:
            try:
                conditions.append(run_columns.condition(text))
            except run_columns.BadCondition as err:
                problems.append(str(err))
        if problems:
            raise forms.ValidationError(problems)
        return conditions


class RunFilterForm(forms.Form):
    q = forms.CharField(required=False, label="Search", widget=forms.SearchInput(attrs={"placeholder": "run name"}))
    status = forms.ChoiceField(required=False, choices=[("", "any status"), *Run.Status.choices])
    owner = forms.ModelChoiceField(
        required=False, queryset=get_user_model().objects.none(), to_field_name="username", empty_label="anyone"
    )
    tag = forms.CharField(required=False, max_length=notes.MAX_TAG_LENGTH,
                          widget=forms.TextInput(attrs={"placeholder": "tag", "size": 12, "aria-label": "tag"}))

    # "trainer.lr = 1e-5", "best:explorer/reward_mean >= 0.5": filters on the table's columns
    # (run_columns.condition), each a ?where= of its own, all of them met.
    where = ConditionsField(required=False, label="Filter")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["owner"].queryset = (
            get_user_model().objects.filter(runs__isnull=False).distinct().order_by("username")
        )

    def filter(self, runs):
        """runs narrowed by the valid filters (an invalid one is ignored and shown as an error)."""
        self.is_valid()
        data = self.cleaned_data
        if data.get("q"):
            runs = runs.filter(name__icontains=data["q"])
        if data.get("status"):
            runs = runs.filter(status=data["status"])
        if data.get("owner"):
            runs = runs.filter(owner=data["owner"])
        if data.get("tag"):
            runs = notes.with_tag(runs, data["tag"])
        for index, condition in enumerate(data.get("where") or []):
            runs = condition.apply(runs, f"where_{index}")
        return runs

    def clean_tag(self):
        tag = self.cleaned_data["tag"].strip().lower()
        if tag and not notes.TAG.fullmatch(tag):
            raise forms.ValidationError(f"{tag!r} is not a tag: a tag has {notes.TAG_RULE}")
        return tag


class RolloutFilterForm(forms.Form):
    q = forms.CharField(
        required=False, label="Search", widget=forms.SearchInput(attrs={"placeholder": "prompt or response text"})
    )
    step = forms.IntegerField(required=False, min_value=0, label="Explorer step")
    min_reward = forms.FloatField(required=False, label="Reward ≥", widget=forms.NumberInput(attrs={"step": "any"}))
    max_reward = forms.FloatField(required=False, label="Reward ≤", widget=forms.NumberInput(attrs={"step": "any"}))
    source = forms.ChoiceField(required=False, choices=[("", "any source"), *Experience.Source.choices])

    def filter(self, experiences):
        data = self.cleaned_data if self.is_valid() else {}
        if data.get("q"):
            experiences = experiences.filter(
                Q(prompt_text__icontains=data["q"]) | Q(response_text__icontains=data["q"])
            )
        if data.get("step") is not None:
            experiences = experiences.filter(explorer_step=data["step"])
        if data.get("min_reward") is not None:
            experiences = experiences.filter(reward__gte=data["min_reward"])
        if data.get("max_reward") is not None:
            experiences = experiences.filter(reward__lte=data["max_reward"])
        if data.get("source"):
            experiences = experiences.filter(source=data["source"])
        return experiences


class ReportForm(forms.ModelForm):
    """A comparison saved as a report (views_reports): the compare page's runs, charts' filter and
    smoothing, and samples, with a name and a note."""

    # More than a whole sweep (sweeps.MAX_RUNS): "Compare these runs" of a 24-run sweep could not
    # be saved at 20. 50 ids of up to 10 digits fit the field.
    MAX_RUNS = 50
    runs = forms.CharField(widget=forms.HiddenInput, max_length=600)

    class Meta:
        model = Report
        fields = ("name", "note", "chart_filter", "chart_smoothing", "sample_task", "sample_step")
        widgets = {"note": forms.Textarea(attrs={"rows": 3, "maxlength": 10_000,
                                                 "placeholder": "what these runs show, for whoever opens the link"}),
                   "chart_filter": forms.HiddenInput, "chart_smoothing": forms.HiddenInput,
                   "sample_task": forms.HiddenInput, "sample_step": forms.HiddenInput}

    def clean_note(self):
        note = self.cleaned_data["note"]
        if len(note) > 10_000:
            raise forms.ValidationError("at most 10,000 characters")
        return note

    def clean_runs(self):
        ids, problems = ids_sent(self.cleaned_data["runs"].split(","), "")
        if problems:
            raise forms.ValidationError(problems)
        ids = list(dict.fromkeys(ids))
        if not 1 <= len(ids) <= self.MAX_RUNS:
            raise forms.ValidationError(f"a report compares 1 to {self.MAX_RUNS} runs")
        missing = set(ids) - set(Run.objects.filter(pk__in=ids).values_list("pk", flat=True))
        if missing:
            raise forms.ValidationError(f"no run with id {', '.join(map(str, sorted(missing)))}")
        return ids

    def save(self, commit=True):
        self.instance.run_ids = self.cleaned_data["runs"]
        return super().save(commit)
