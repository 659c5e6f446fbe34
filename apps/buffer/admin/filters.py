"""The experience list's filters."""


from django.contrib import admin
from django.contrib.admin.views.main import PAGE_VAR
from django.db.models import Exists, OuterRef

from apps.feedback.models import Feedback


class RewardRangeFilter(admin.FieldListFilter):
    """reward between a minimum and a maximum, typed into a small form (both optional)."""

    template = "admin/buffer/range_filter.html"

    def __init__(self, field, request, params, model, model_admin, field_path):
        self.lookup_min, self.lookup_max = f"{field_path}__gte", f"{field_path}__lte"
        super().__init__(field, request, params, model, model_admin, field_path)

    def expected_parameters(self):
        return [self.lookup_min, self.lookup_max]

    def queryset(self, request, queryset):
        bounds = {}
        for lookup, values in self.used_parameters.items():
            try:
                bounds[lookup] = float(values[-1])
            except ValueError:
                raise admin.options.IncorrectLookupParameters(f"{lookup} must be a number") from None
        return queryset.filter(**bounds)

    def choices(self, changelist):
        # One "choice": the form, with the other parameters of the page as hidden fields.
        current = {name: values[-1] for name, values in self.used_parameters.items()}
        yield {
            "lookup_min": self.lookup_min,
            "lookup_max": self.lookup_max,
            "min": current.get(self.lookup_min, ""),
            "max": current.get(self.lookup_max, ""),
            "hidden": [
                (name, value)
                for name, value in changelist.params.items()
                if name not in (PAGE_VAR, *self.expected_parameters())
            ],
            "clear_url": changelist.get_query_string(remove=self.expected_parameters()),
        }


class YesNoFilter(admin.SimpleListFilter):
    def lookups(self, request, model_admin):
        return [("yes", "Yes"), ("no", "No")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(self.condition())
        if self.value() == "no":
            return queryset.exclude(self.condition())
        return queryset


class HasFeedbackFilter(YesNoFilter):
    title = "has feedback"
    parameter_name = "has_feedback"

    def condition(self):
        return Exists(Feedback.objects.filter(experience=OuterRef("pk")))


class FlaggedFilter(YesNoFilter):
    title = "flagged"
    parameter_name = "flagged"

    def condition(self):
        return Exists(Feedback.objects.filter(experience=OuterRef("pk"), kind=Feedback.Kind.FLAG))


class RunFilter(admin.RelatedFieldListFilter):
    def field_choices(self, field, request, model_admin):
        # Names only: a run's str() needs its status, and its row a config of kilobytes.
        runs = field.related_model.objects.order_by("-pk").values_list("pk", "name")
        return [(pk, f"{name} (#{pk})") for pk, name in runs]

    def choices(self, changelist):
        for choice in super().choices(changelist):
            if choice["display"] == self.empty_value_display:
                choice["display"] = "imported (no run)"
            yield choice
