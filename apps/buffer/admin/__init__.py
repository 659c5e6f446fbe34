"""The curators' admin for the buffer: experiences (list, filters, full-text search, bulk actions,
a readable detail page, expert data import) and the jobs that import, export and transform them.

Built for a million experiences: the list reads only the columns it shows (token arrays stay in
the database, previews are cut there), counts are capped (EstimatedCountPaginator), the
search matches the indexed documents of models.ExperienceSearch (search.py), and every bulk action
is one statement or a Celery job. Actions and pages change state through services, never directly.
"""

from . import datasets, experiences, jobs  # noqa: F401 - registers the model admins
from .actions import ExportActionForm, confirm_action, export_action

__all__ = ["ExportActionForm", "confirm_action", "export_action"]
