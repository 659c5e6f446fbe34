from django.apps import AppConfig


class TasksetsConfig(AppConfig):
    name = "apps.tasksets"
    label = "tasksets"
