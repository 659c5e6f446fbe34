"""What the bulk actions of the buffer's admins share (the runs' and the feedback admin's too): the
confirmation page, and export in one step."""


from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import Max
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from apps.core.numbers import whole_number

from .. import exporters, services
from ..forms import ExportForm

CONFIRM_SAMPLE_ROWS = 10


class ExportActionForm(helpers.ActionForm):
    """The action bar, with the export format beside the action: Export is one step."""

    # Checked by export_action (ExportForm), which names a bad value; as a ChoiceField here it would
    # fail the whole action bar with Django's "No action selected."
    export_format = forms.CharField(
        label="Export as", required=False, widget=forms.Select(choices=ExportForm.base_fields["format"].choices)
    )


def confirm_action(model_admin, request, queryset, title, description, *, perform, form_class=None):
    """The confirmation page of a bulk action, with its options; on confirmation,
    `perform(options, rows)`.

    The page posts back to the changelist URL it came from (so the same filters select the same
    rows) with the action, its selection, `confirm` and `through`, the newest row it counted:
    `rows` are the selection's up to that one. A run writing meanwhile added rows that matched
    the filters: 8,060 experiences shown became 8,173 deleted. `perform` returns None (back to
    the list) or a response."""
    confirmed = request.POST.get("confirm") == "yes"
    form = form_class(request.POST if confirmed else None) if form_class else None
    if confirmed and (form is None or form.is_valid()):
        through = whole_number(request.POST.get("through", ""))
        if through is None:
            model_admin.message_user(request, "The confirmation did not say which rows it counted: nothing was "
                                              "changed. Choose the action again.", messages.ERROR)
            return None
        return perform(form.cleaned_data if form else {}, queryset.filter(pk__lte=through))
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "description": description,
        "opts": model_admin.opts,
        "form": form,
        "count": queryset.count(),
        "through": queryset.aggregate(newest=Max("pk"))["newest"] or 0,
        "sample": queryset[:CONFIRM_SAMPLE_ROWS],
        "action": request.POST["action"],
        "select_across": request.POST.get("select_across", "0"),
        "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, "admin/buffer/confirm_action.html", context)


def export_action(model_admin, request, queryset):
    """The export bulk action, shared by the experience and feedback admins: it starts the export
    at once in the format chosen beside it, and the job page shows its progress, then downloads the
    file (static/js/job_progress.js; ?download=1). Formats: docs/data-formats.md."""
    form = ExportForm({"format": request.POST.get("export_format") or exporters.FORMATS[0]})
    if not form.is_valid():
        model_admin.message_user(request, f"Export: {form.errors['format'][0]}", messages.ERROR)
        return None
    job = services.start_export(queryset, fmt=form.cleaned_data["format"], user=request.user)
    return HttpResponseRedirect(reverse("admin:buffer_bufferjob_change", args=[job.pk]) + "?download=1")
