from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    name = "bench.benchapp"
    label = "pmcp_benchapp"
    default_auto_field = "django.db.models.BigAutoField"
