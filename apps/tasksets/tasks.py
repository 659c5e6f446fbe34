from celery import shared_task

from . import services


@shared_task(name="apps.tasksets.tasks.run_import")  # the default queue
def run_import(job_id: int) -> str:
    """Import an uploaded taskset file (see services.run_taskset_import); returns the job's status."""
    return services.run_taskset_import(job_id).status
