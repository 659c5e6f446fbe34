from django.contrib import admin

from .models import Task, Taskset


@admin.register(Taskset)
class TasksetAdmin(admin.ModelAdmin):
    list_display = ("name", "task_count", "default_workflow", "default_reward_fn", "source", "created_by", "created_at")
    search_fields = ("name", "description")
    readonly_fields = ("task_count", "created_at")


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ("taskset", "index", "short_prompt", "answer", "difficulty", "priority", "times_sampled")
    list_filter = ("taskset",)
    search_fields = ("answer",)
    list_select_related = ("taskset",)

    @admin.display(description="prompt")
    def short_prompt(self, task):
        return task.prompt_text[:80]
