"""The API's tasksets (docs/api.md; issue #44, item 7): list them, read one with a page of its
tasks, upload one with a field mapping, and follow its import. The upload is the upload page's: the
same form and checks (TasksetUploadForm, its defaults for what a script leaves out), and the same
import job (apps/tasksets/services.py), whose progress `imports/<id>/` answers."""
from datetime import datetime
from typing import Any

from django.shortcuts import get_object_or_404
from django.urls import reverse
from ninja import Field, File, Form, Query, Router, Schema, UploadedFile

from apps.core.jobs import visible_job
from apps.tasksets import services
from apps.tasksets.forms import TasksetUploadForm
from apps.tasksets.models import Taskset, TasksetImport

from .auth import ApiError
from .bodies import refuse_unknown
from .paging import page_of
from .schemas import PAGE, PAGE_SIZE, ErrorOut, Id

router = Router(tags=["tasksets"])
REFUSED = {401: ErrorOut, 403: ErrorOut}


class Paging(Schema):
    page: str | None = PAGE
    page_size: str | None = PAGE_SIZE


class UploadIn(Schema):
    """The upload's form fields (the file comes as `file`); what is left out takes the upload page's
    default. Checked as the page checks them: a 400 names each wrong one."""

    name: str | None = Field(None, description="the new taskset's name: letters, digits, - and _")
    format: str | None = Field(None, description="auto (from the file's extension), jsonl, csv or parquet")
    prompt_field: str | None = Field(None, description="the column or key of the prompt (default prompt)")
    answer_field: str | None = Field(None, description="the column or key of the answer (default answer)")
    metadata_fields: str | None = Field(None, description="columns or keys copied into each task's metadata, "
                                                          "comma-separated")
    difficulty_field: str | None = Field(None, description="a numeric column or key")
    description: str | None = None
    default_workflow: str | None = None
    default_reward_fn: str | None = None


UPLOAD_FIELDS = tuple(UploadIn.model_fields)  # `file` aside


class TasksetOut(Schema):
    name: str
    description: str
    tasks: int = Field(description="how many tasks it holds")
    default_workflow: str
    default_reward_fn: str
    source: str = Field(description="the file or generator it came from")
    field_mapping: dict[str, Any] = Field(description="which columns or keys of the file became prompt, answer...")
    created_by: str | None
    created_at: datetime
    url: str


class TaskOut(Schema):
    index: int
    prompt: str | list[dict[str, Any]] = Field(description="text, or chat messages {role, content}")
    answer: str
    metadata: dict[str, Any]
    difficulty: float


class TaskPage(Schema):
    count: int
    page: int
    pages: int
    results: list[TaskOut]


class TasksetPage(Schema):
    count: int
    page: int
    pages: int
    results: list[TasksetOut]


class TasksetDetailOut(TasksetOut):
    task_page: TaskPage = Field(description="a page of its tasks, in their order (?page=, ?page_size=)")


class ImportOut(Schema):
    id: int
    name: str = Field(description="the taskset it creates")
    status: str = Field(description="pending, running, succeeded, failed or cancelled")
    rows_done: int
    bytes_done: int
    bytes_total: int
    error: str
    taskset: str | None = Field(description="the taskset's name once the import is done")
    url: str = Field(description="this import's progress")


def taskset_json(taskset: Taskset) -> dict:
    return {"name": taskset.name, "description": taskset.description, "tasks": taskset.task_count,
            "default_workflow": taskset.default_workflow, "default_reward_fn": taskset.default_reward_fn,
            "source": taskset.source, "field_mapping": taskset.field_mapping,
            "created_by": taskset.created_by.get_username() if taskset.created_by else None,
            "created_at": taskset.created_at, "url": reverse("api-taskset", args=[taskset.name])}


def import_json(job: TasksetImport) -> dict:
    return {"id": job.pk, "name": job.name, "status": job.status, "rows_done": job.rows_done,
            "bytes_done": job.bytes_done, "bytes_total": job.bytes_total, "error": job.error,
            # Only once shown: a running import's job points at its hidden taskset, which
            # /api/tasksets/<name>/ does not know (404) and a launch refuses.
            # Read by id: a failing import deletes its hidden taskset while the job still names it
            # (job.taskset raised DoesNotExist: a 500 page to 1 poll in 7).
            "taskset": Taskset.objects.filter(pk=job.taskset_id, ready=True).values_list("name", flat=True).first(),
            "url": reverse("api-taskset-import", args=[job.pk])}


@router.get("/", response={200: TasksetPage, 400: ErrorOut, **REFUSED}, url_name="api-tasksets",
            summary="List tasksets")
def list_tasksets(request, paging: Query[Paging]):
    page = page_of(Taskset.objects.select_related("created_by").order_by("name"), paging.page, paging.page_size)
    return {**page, "results": [taskset_json(t) for t in page["results"]]}


@router.post("/", response={202: ImportOut, 400: ErrorOut, 415: ErrorOut, **REFUSED}, url_name="api-tasksets",
             summary="Upload a taskset")
def upload_taskset(request, fields: Form[UploadIn], file: File[UploadedFile] = None):
    """multipart/form-data: `file` (JSONL, CSV or Parquet) and `name`; optional, as the upload page
    has them: `format` (auto), `prompt_field` (prompt), `answer_field` (answer), `metadata_fields`
    (comma-separated), `difficulty_field`, `description`, `default_workflow`, `default_reward_fn`.
    202 with the import, which runs as a job: follow its `url` until `status` is succeeded (or failed,
    saying why). 400 names each field that is wrong, sent twice or not one of these (with the closest
    one that is); nothing is imported then. 415
    for a body that is not multipart/form-data."""
    _refuse_what_the_form_cannot_read(request)
    defaults = {name: field.initial for name, field in TasksetUploadForm.base_fields.items() if field.initial}
    sent = {key: value for key, value in fields.dict().items() if value is not None}
    form = TasksetUploadForm({**defaults, **sent}, request.FILES, user=request.user)
    if not form.is_valid():
        raise ApiError(400, "invalid taskset upload", errors=form.errors)
    data = form.cleaned_data
    job = services.start_taskset_import(
        upload=form.upload, name=data["name"], fmt=data["format"], mapping=form.mapping,
        description=data["description"], default_workflow=data["default_workflow"],
        default_reward_fn=data["default_reward_fn"], user=request.user,
    )
    return 202, import_json(job)


def _refuse_what_the_form_cannot_read(request) -> None:
    """The upload is a form with a file: a JSON body (whose `name` the form never saw: it answered
    "name: This field is required.") is a 415 saying how to send it; a part the form does not read
    (`promt_field=question` was a 202 that imported the `prompt` column) and a part sent twice, of
    which the form would read one, are a 400 naming it."""
    if request.content_type != "multipart/form-data":
        raise ApiError(415, f"send the upload as multipart/form-data, not {request.content_type or 'no body'}: "
                            f"a `file` part (JSONL, CSV or Parquet) and the form's fields: {', '.join(UPLOAD_FIELDS)}")
    sent = [key for key in (*request.POST, *request.FILES) if key != "csrfmiddlewaretoken"]  # a session's form's
    refuse_unknown(sent, ("file", *UPLOAD_FIELDS), "field", " in the form")
    twice = [field for field in ("file", *UPLOAD_FIELDS)
             if len(request.POST.getlist(field)) + len(request.FILES.getlist(field)) > 1]
    if twice:
        raise ApiError(400, f"sent more than once: {', '.join(twice)}",
                       errors={field: ["sent more than once: send one"] for field in twice})


@router.get("/imports/{pk}/", response={200: ImportOut, 404: ErrorOut, **REFUSED}, url_name="api-taskset-import",
            summary="An upload's import")
def taskset_import(request, pk: Id):
    job = visible_job("tasksets.tasksetimport", pk, request.user)  # someone else's: as missing
    if job is None:
        raise ApiError(404, f"no taskset import {pk}")
    return import_json(job)


@router.get("/{name}/", response={200: TasksetDetailOut, 400: ErrorOut, 404: ErrorOut, **REFUSED},
            url_name="api-taskset", summary="One taskset, with a page of its tasks")
def taskset_detail(request, name: str, paging: Query[Paging]):
    taskset = get_object_or_404(Taskset.objects.select_related("created_by"), name=name)
    page = page_of(taskset.own_tasks.order_by("index").values("index", "prompt", "answer", "metadata", "difficulty"),
                   paging.page, paging.page_size)
    return {**taskset_json(taskset), "task_page": {**page, "results": list(page["results"])}}
