"""One page of a list, as every list of the API answers it: `{count, page, pages, results}`."""
from django.core.paginator import Paginator

PAGE_SIZE, MAX_PAGE_SIZE = 50, 500


def page_of(items, page, page_size) -> dict:
    """`{count, page, pages}` and the page's items; a page size that is not a number is the default."""
    try:
        size = min(max(int(page_size or PAGE_SIZE), 1), MAX_PAGE_SIZE)
    except ValueError:
        size = PAGE_SIZE
    found = Paginator(items, size).get_page(page)
    return {"count": found.paginator.count, "page": found.number, "pages": found.paginator.num_pages,
            "results": found.object_list}
