from celery import shared_task

from . import jobs


@shared_task(name="apps.core.tasks.run_job")  # the default queue (jobs.enqueue_job)
def run_job(job_label: str, job_id: int) -> str:
    """Run a queued job of any type (jobs.run_job); returns its status."""
    return jobs.run_job(job_label, job_id).status
