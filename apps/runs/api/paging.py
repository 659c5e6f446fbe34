"""One page of a list, as every list of the API answers it: `{count, page, pages, results}`; a
cursor's page of one that grows while a script reads it; the cap on a metrics answer. A page, a
page size or a limit that is not a number from 1 is a 400 naming it: page_size=0 read as 1 and
page_size=abc as 50, so a script's mistake came back as a page it did not ask for."""
from django.core.paginator import Paginator

from apps.core.numbers import whole_number

from .auth import ApiError

PAGE_SIZE, MAX_PAGE_SIZE = 50, 500
# Points per role in one metrics answer: a point is ~600 bytes, so at most ~3 MB a role (a 100k-step
# run answered 100+ MB in one piece). The answer says where to go on from (`next_since`).
MAX_METRIC_POINTS = 5000


def number_parameter(sent: str | None, name: str, what: str, *, least: int = 0) -> int | None:
    """A whole-number query parameter, None when not sent; 400 naming it when it is not one, or
    is below `least`."""
    if sent is None:
        return None
    if (number := whole_number(sent)) is None or number < least:
        raise ApiError(400, f"{name} must be {what}")
    return number


def count_parameter(sent: str | None, name: str, *, cap: int, default: int) -> int:
    """A count from 1 (page_size, limit): `default` when not sent, and a larger number read as `cap`."""
    number = number_parameter(sent, name, f"a whole number from 1 to {cap}", least=1)
    return default if number is None else min(number, cap)


def page_of(items, page, page_size) -> dict:
    """`{count, page, pages}` and the page's items (a page past the last answers the last)."""
    size = count_parameter(page_size, "page_size", cap=MAX_PAGE_SIZE, default=PAGE_SIZE)
    number = number_parameter(page, "page", "a whole number from 1", least=1)
    found = Paginator(items, size).get_page(number)
    return {"count": found.paginator.count, "page": found.number, "pages": found.paginator.num_pages,
            "results": found.object_list}


def page_after(items, after_id: int, page_size) -> dict:
    """The first page of the items with an id above `after_id`, in id order, and `next_after_id`:
    its last id, or `after_id` when nothing is newer. Pages by number are newest first, so rows
    written while a script read them shifted every later page (it read some twice, some never)
    and a page past the end answered the last one again; ids only grow, so this cursor reads each
    row once, and an empty page means "nothing new yet". (Two writers committing at once can make
    a row visible after a higher id: docs/api.md, "Following a run", says what a script does.)"""
    page = page_of(items.filter(pk__gt=after_id).order_by("pk"), 1, page_size)
    results = list(page["results"])
    return {**page, "results": results, "next_after_id": results[-1].pk if results else after_id}
