"""The API's sweeps (docs/api.md; issue #44, items 1 and 7): launch one, list them, read one with
its runs' swept values and results. A launch is the launch form's (apps/runs/sweeps.py): every
run's config validated before any run is made."""
from datetime import datetime
from typing import Any

from django.shortcuts import get_object_or_404
from django.urls import reverse
from ninja import Field, Query, Router, Schema, Status
from pydantic import ConfigDict

from workers.rft.config import ConfigError, ConfigIssue
from workers.rft.config_issues import unknown_hint
from workers.rft.config_text import MAX_REPORTED_ISSUES

from .. import sweeps
from ..models import Sweep
from .bodies import MAX_NAME, SHOWN_FIELD, config_of, invalid, json_body, known_fields, name_of
from .paging import page_of
from .schemas import CONFIG_IN, PAGE, PAGE_SIZE, ErrorOut, Id, RunOut, run_json

router = Router(tags=["sweeps"])
REFUSED = {401: ErrorOut, 403: ErrorOut}
VALUES_AXIS, RANGE_AXIS = {"key", "values"}, {"key", "low", "high", "scale"}  # the fields each kind of axis takes


class Paging(Schema):
    page: str | None = PAGE
    page_size: str | None = PAGE_SIZE


class AxisIn(Schema):
    model_config = ConfigDict(extra="forbid")  # documented: the route refuses any other field (_axis_problems)

    key: str = Field(description="a config key, dotted: trainer.lr")
    values: list[float | int | str | bool | None] | None = Field(
        None, description=f"the values to try (1 to {sweeps.MAX_VALUES}); or, random search only, a range:")
    low: float | None = Field(None, description="a range's lower end")
    high: float | None = Field(None, description="a range's upper end")
    scale: str | None = Field("linear", description="linear or log (low > 0)")


class SweepIn(Schema):
    """Documents the launch body; the route reads it itself (its own message for each problem)."""

    model_config = ConfigDict(extra="forbid")  # documented: the route refuses any other field

    name: str = Field("api sweep", max_length=MAX_NAME, description="its runs are named after it and their values")
    config: dict[str, Any] | str = Field(description="the base config (docs/config.md), a mapping or YAML text; "
                                                     "{} for the defaults", json_schema_extra=CONFIG_IN)
    method: str = Field("grid", description="grid: every combination of listed values · random: `count` draws")
    space: list[AxisIn] = Field(description=f"the swept keys, at most {sweeps.MAX_KEYS}")
    count: int | None = Field(None, description=f"random search only: how many runs (1 to {sweeps.MAX_RUNS})")
    seed: int = Field(0, description="random search: the same seed draws the same runs")


class SweepRunOut(RunOut):
    swept: dict[str, Any] = Field(description="the values this run was given")
    held_out_best: float | None = Field(description="its best held-out figure (explorer.eval_interval), if any")


class SweepOut(Schema):
    id: int
    name: str
    owner: str
    method: str
    space: list[dict[str, Any]]
    count: int
    seed: int
    created_at: datetime
    ended_at: datetime | None = Field(description="when its last run finished")
    url: str = Field(description="its page")


class SweepDetailOut(SweepOut):
    runs: list[SweepRunOut] = Field(description="best held-out figure first")


class SweepPage(Schema):
    count: int
    page: int
    pages: int
    results: list[SweepOut]


def sweep_json(sweep: Sweep) -> dict:
    return {"id": sweep.pk, "name": sweep.name, "owner": sweep.owner.username, "method": sweep.method,
            "space": sweep.space, "count": sweep.count, "seed": sweep.seed, "created_at": sweep.created_at,
            "ended_at": sweep.ended_at, "url": reverse("sweep-detail", args=[sweep.pk])}


def _detail(pk: int) -> dict:
    sweep = get_object_or_404(Sweep.objects.select_related("owner"), pk=pk)
    rows = sweeps.table(sweep)["rows"]
    return {**sweep_json(sweep), "runs": [
        {**run_json(row["run"]), "swept": row["run"].swept, "held_out_best": row["result"]} for row in rows
    ]}


@router.get("/", response={200: SweepPage, 400: ErrorOut, **REFUSED}, url_name="api-sweeps", summary="List sweeps")
def list_sweeps(request, paging: Query[Paging]):
    """Newest first."""
    page = page_of(Sweep.objects.select_related("owner"), paging.page, paging.page_size)
    return {**page, "results": [sweep_json(sweep) for sweep in page["results"]]}


@router.post(
    "/", response={201: SweepDetailOut, 400: ErrorOut, **REFUSED}, url_name="api-sweeps", summary="Launch a sweep",
    openapi_extra={"requestBody": {
        "required": True, "content": {"application/json": {"schema": SweepIn.model_json_schema()}}
    }},
)
def launch_sweep(request):
    """201 with the sweep and its runs, queued as any run. 400 names each problem (the space, or a
    config key with the values that made it wrong); no run is made then."""
    body = json_body(request)
    known_fields(body, SweepIn.model_fields)
    name = name_of(body, "api sweep")
    try:
        _refuse_what_the_method_ignores(body)
        sweep = sweeps.launch_sweep(request.user, name, config_of(body), body.get("space"),
                                    body.get("method", "grid"), body.get("count"), _seed(body.get("seed", 0)))
    except sweeps.SweepError as err:
        raise invalid(err, "invalid sweep") from None
    except ConfigError as err:
        raise invalid(err) from None
    return Status(201, _detail(sweep.pk))


def _refuse_what_the_method_ignores(body: dict) -> None:
    """A field the sweep would not read is refused by name rather than dropped: `count` on a grid
    (which runs every combination), an axis's range field beside its `values`, or a misspelt one."""
    issues = [issue for axis in _axes(body.get("space")) for issue in _axis_problems(axis)]
    if body.get("method", Sweep.Method.GRID) == Sweep.Method.GRID and body.get("count") is not None:
        issues.insert(0, ConfigIssue("count", "a grid makes one run per combination of its values; "
                                              "count is for method random"))
    if issues:
        raise sweeps.SweepError(issues[:MAX_REPORTED_ISSUES])


def _axes(space) -> list[dict]:
    """The axes that are objects; sweeps.axes_of says what is wrong with the rest."""
    return [axis for axis in space if isinstance(axis, dict)] if isinstance(space, list) else []


def _axis_problems(axis: dict) -> list[ConfigIssue]:
    """An axis lists `values` or gives a range (low, high, scale): each other field it carries."""
    key = axis["key"][:SHOWN_FIELD] if isinstance(axis.get("key"), str) else "sweep"
    taken = VALUES_AXIS if "values" in axis else RANGE_AXIS
    issues = []
    for field in axis:
        if field in taken:
            continue
        if field in AxisIn.model_fields:
            message = f"'{field}' belongs to a range, and this axis lists `values`: give one or the other"
        else:
            message = f"unknown field '{field[:SHOWN_FIELD]}'" + unknown_hint(field, list(AxisIn.model_fields),
                                                                           len(issues), "known fields")
        issues.append(ConfigIssue(key, message))
    return issues


def _seed(seed) -> int:
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
        raise sweeps.SweepError([ConfigIssue("seed", "a whole number from 0 to 2^31 - 1")])
    return seed


@router.get("/{pk}/", response={200: SweepDetailOut, 404: ErrorOut, **REFUSED}, url_name="api-sweep",
            summary="One sweep, with its runs")
def sweep_detail(request, pk: Id):
    return _detail(pk)

