from celery import shared_task

from . import services


@shared_task(name="apps.buffer.tasks.run_buffer_job")  # the default queue
def run_buffer_job(job_id: int) -> str:
    """Run a curation job (import, export, re-score, promote, pipeline operator); returns its status."""
    return services.run_job(job_id).status
