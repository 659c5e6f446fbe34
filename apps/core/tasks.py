from celery import shared_task

from . import hidden_imports, jobs


@shared_task(name="apps.core.tasks.run_job")  # the default queue (jobs.enqueue_job)
def run_job(job_label: str, job_id: int) -> str:
    """Run a queued job of any type (jobs.run_job); returns its status."""
    return jobs.run_job(job_label, job_id).status


@shared_task(name="apps.core.tasks.delete_leftovers")
def delete_leftovers() -> list[str]:
    """Delete the hidden holders whose importer is gone, those set aside by an import of their name
    among them (hidden_imports.HiddenImports.set_aside); returns them."""
    return hidden_imports.delete_leftovers()
