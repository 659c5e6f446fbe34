"""One page of a list, as every list of the API answers it: `{count, page, pages, results}`; a
cursor's page of one that grows while a script reads it; the cap on a metrics answer."""
from django.core.paginator import Paginator

PAGE_SIZE, MAX_PAGE_SIZE = 50, 500
# Points per role in one metrics answer: a point is ~600 bytes, so at most ~3 MB a role (a 100k-step
# run answered 100+ MB in one piece). The answer says where to go on from (`next_since`).
MAX_METRIC_POINTS = 5000


def page_of(items, page, page_size) -> dict:
    """`{count, page, pages}` and the page's items; a page size that is not a number is the default."""
    try:
        size = min(max(int(page_size or PAGE_SIZE), 1), MAX_PAGE_SIZE)
    except ValueError:
        size = PAGE_SIZE
    found = Paginator(items, size).get_page(page)
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
