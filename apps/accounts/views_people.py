"""People (issue #44, item 5): a curator adds users, sets their roles, lets them log in or not, and
assigns annotators to runs, from the app's own pages rather than the Django admin. Nobody is
deleted here: their judgements and runs stay theirs."""
from datetime import UTC, datetime

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db import transaction
from django.db.models import Count
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.core.bidi import isolate
from apps.core.numbers import whole_number
from apps.feedback import services as feedback
from apps.feedback.models import RunAnnotators
from apps.runs.models import Run
from rftweb.errors import form_checks_nul

from . import throttle
from .roles import CURATOR, ROLES, role_required, roles_of
from .services import PeopleError, create_user, set_active, set_roles

PEOPLE_PER_PAGE = 100
ROLE_HELP = {"annotator": "rates, edits and compares", "reviewer": "accepts or rejects judgements",
             "researcher": "launches and controls runs", "curator": "cleans the buffer, manages people"}


class PersonForm(forms.Form):
    username = forms.CharField(max_length=150)
    email = forms.EmailField(required=False)
    password = forms.CharField(widget=forms.PasswordInput,
                               help_text="tell them: they change it on their Change password page")
    roles = forms.MultipleChoiceField(choices=[(role, role) for role in ROLES], widget=forms.CheckboxSelectMultiple,
                                      required=False)

    def clean_username(self):
        name = self.cleaned_data["username"].strip()
        field = get_user_model()._meta.get_field("username")
        try:
            field.run_validators(name)
        except ValidationError as err:
            raise forms.ValidationError(err.messages) from None
        if get_user_model().objects.filter(username__iexact=name).exists():
            raise forms.ValidationError(f"{name} is taken")
        return name

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("password") and cleaned.get("username"):
            try:
                someone = get_user_model()(username=cleaned["username"])
                password_validation.validate_password(cleaned["password"], someone)
            except ValidationError as err:
                self.add_error("password", err)
        return cleaned


@form_checks_nul
@role_required(CURATOR)
def people(request):
    form = PersonForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        person = create_user(data["username"], data["password"], roles=data["roles"], email=data["email"])
        messages.success(request, f"Added {isolate(person.username)} ({', '.join(data['roles']) or 'no role yet'}).")
        return redirect("person-detail", pk=person.pk)
    listed = get_user_model().objects.order_by("username").annotate(judgements=Count("feedback", distinct=True),
                                                                      runs_owned=Count("runs", distinct=True))
    page = Paginator(listed, PEOPLE_PER_PAGE).get_page(request.GET.get("page"))
    for person in page.object_list:
        person.roles_held = [role for role in ROLES if role in roles_of(person)]
    return render(request, "accounts/people.html", {"page": page, "form": form, "role_help": ROLE_HELP})


@role_required(CURATOR)
def person_detail(request, pk):
    person = get_object_or_404(get_user_model(), pk=pk)
    held = roles_of(person)
    assigned = RunAnnotators.objects.filter(users=person).select_related("run").order_by("-run__created_at")
    failures, locked_until = throttle.account_lock(person.get_username())
    return render(request, "accounts/person.html", {
        "failed_logins": failures, "locked_until": locked_until and datetime.fromtimestamp(locked_until, UTC),
        "login_limit": settings.RFTWEB_LOGIN_FAILURES_PER_ACCOUNT,
        "person": person, "roles": [(role, role in held, ROLE_HELP[role]) for role in ROLES],
        "assigned": assigned, "runs": Run.objects.exclude(pk__in=[a.run_id for a in assigned])[:200],
        "judgements": person.feedback.count(),
    })


@require_POST
@role_required(CURATOR)
def person_roles(request, pk):
    person = get_object_or_404(get_user_model(), pk=pk)
    try:
        with transaction.atomic():  # both or neither: a refused role change keeps the login as it was
            set_active(person, request.POST.get("active") == "on", by=request.user)
            set_roles(person, request.POST.getlist("roles"), by=request.user)
    except PeopleError as exc:
        messages.error(request, f"Nothing changed: {exc}.")
    else:
        messages.success(request, f"Saved {isolate(person.username)}: "
                                  f"{', '.join(request.POST.getlist('roles')) or 'no role'}"
                                  f"{'' if person.is_active else ', cannot log in'}.")
    return redirect("person-detail", pk=pk)


@require_POST
@role_required(CURATOR)
def person_unlock(request, pk):
    """Let a person locked out by failed logins (throttle.py) log in again now."""
    person = get_object_or_404(get_user_model(), pk=pk)
    throttle.unlock_account(person.get_username())
    messages.success(request, f"{isolate(person.username)} may log in again: their failed logins no longer count.")
    return redirect("person-detail", pk=pk)


@require_POST
@role_required(CURATOR)
def person_assign(request, pk):
    person = get_object_or_404(get_user_model(), pk=pk)
    run_id = whole_number(request.POST.get("run"))
    run = get_object_or_404(Run, pk=run_id) if run_id is not None else None
    if run is None:
        messages.error(request, "Pick a run to assign them to.")
        return redirect("person-detail", pk=pk)
    assigned = request.POST.get("action") != "remove"
    try:
        access = feedback.assign_annotator(run, person, request.user, assigned=assigned)
    except feedback.FeedbackError as exc:
        messages.error(request, str(exc))
    else:
        if not assigned:
            messages.success(request, f"{isolate(person.username)} no longer annotates {isolate(run.name)}"
                                      f"{' (open to every annotator: they still may)' if access.open_to_all else ''}.")
        else:
            messages.success(request, f"{isolate(person.username)} annotates {isolate(run.name)}" + (
                ": it is open to every annotator now; the assignment counts once its owner limits it"
                if access.open_to_all else "."))
    return redirect("person-detail", pk=pk)
