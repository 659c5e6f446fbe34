"""What the admin of every job model shares (apps.core.jobs): a pending or running job cannot be
deleted, single or in bulk, and is cancelled instead.

#41: a curator deleted a running retention job; its archive went with it while its worker went on
deleting rows, and nothing was left. A job is a record of work under way until it finishes, so
Delete is offered once it has, and Cancel (on its page, and as a bulk action) while it has not."""

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from . import jobs
from .jobs import JobError


class JobAdminMixin:
    """Mixed into the ModelAdmin of a Job model, before admin.ModelAdmin. Who may cancel a job is
    the model's `may_cancel`; the page's template shows Cancel where `may_cancel` is in its context."""

    actions = ("delete_selected", "cancel_selected")

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and (obj is None or obj.is_finished)

    def has_cancel_permission(self, request, obj=None):
        return obj.may_cancel(request.user) if obj is not None else super().has_delete_permission(request)

    def _change_url(self, job):
        return reverse(f"admin:{job._meta.app_label}_{job._meta.model_name}_change", args=[job.pk])

    def delete_view(self, request, object_id, extra_context=None):
        job = self.get_object(request, unquote(object_id))
        if job is not None and not job.is_finished:
            self.message_user(request, _refusal([job]), messages.ERROR)
            return HttpResponseRedirect(self._change_url(job))
        return super().delete_view(request, object_id, extra_context)

    @admin.action(description="Delete selected %(verbose_name_plural)s", permissions=["delete"])
    def delete_selected(self, request, queryset):
        """Django's delete, on its confirmation and again on its "Yes": refused if one has not finished."""
        refusal = _refusal(queryset)
        if refusal:
            self.message_user(request, refusal, messages.ERROR)
            return None
        return django_delete_selected(self, request, queryset)

    @admin.action(description="Cancel selected %(verbose_name_plural)s", permissions=["cancel"])
    def cancel_selected(self, request, queryset):
        done, refused = [], []
        for job in queryset.filter(status__in=jobs.Job.ACTIVE).order_by("pk"):
            if not job.may_cancel(request.user):
                refused.append(f"{job.pk}: you may not cancel it")
                continue
            try:
                done.append(_cancelled(jobs.cancel_job(job)))
                self.log_change(request, job, "Cancelled")
            except JobError as exc:
                refused.append(str(exc))
        if not done and not refused:
            self.message_user(request, "None of the selected jobs is pending or running: nothing to cancel.",
                              messages.WARNING)
        for text in done:
            self.message_user(request, text, messages.SUCCESS)
        for text in refused:
            self.message_user(request, text, messages.ERROR)

    def get_urls(self):
        opts = self.model._meta
        view = self.admin_site.admin_view(require_POST(self.cancel_view))
        return [path("<path:object_id>/cancel/", view, name=f"{opts.app_label}_{opts.model_name}_cancel"),
                *super().get_urls()]

    def cancel_view(self, request, object_id):
        job = self.get_object(request, unquote(object_id))
        if job is None:
            raise Http404("no such job")
        if not self.has_cancel_permission(request, job):
            raise PermissionDenied
        try:
            job = jobs.cancel_job(job)
        except JobError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            self.log_change(request, job, "Cancelled")
            self.message_user(request, _cancelled(job), messages.SUCCESS)
        return HttpResponseRedirect(self._change_url(job))

    def change_view(self, request, object_id, form_url="", extra_context=None):
        job = self.get_object(request, unquote(object_id))
        offered = job is not None and jobs.cancellable(job) and self.has_cancel_permission(request, job)
        extra_context = {**(extra_context or {}), "may_cancel": offered}
        if offered:
            opts = self.model._meta
            extra_context["cancel_url"] = reverse(f"admin:{opts.app_label}_{opts.model_name}_cancel", args=[job.pk])
        return super().change_view(request, object_id, form_url, extra_context)


def _refusal(doomed) -> str:
    try:
        jobs.refuse_unfinished(doomed)
    except JobError as exc:
        return str(exc)
    return ""


def _cancelled(job) -> str:
    name = f"{job._meta.verbose_name.capitalize()} {job.pk}"
    if job.status == job.Status.CANCELLED and job.started_at is None:
        return f"{name} was cancelled before it started."
    if job.status == job.Status.CANCELLED:  # nobody ran it any more (jobs.orphaned)
        return f"{name} has ended, {job.error}."
    return f"{name} stops at its next safe point (between two chunks of rows); its page shows when it has."
