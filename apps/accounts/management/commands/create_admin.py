import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.services import create_user


class Command(BaseCommand):
    help = "Create the first admin (superuser, all roles). Password from --password or RFTWEB_ADMIN_PASSWORD."

    def add_arguments(self, parser):
        parser.add_argument("--username", default=os.environ.get("RFTWEB_ADMIN_USER", "admin"))
        parser.add_argument("--email", default="")
        parser.add_argument("--password", default=os.environ.get("RFTWEB_ADMIN_PASSWORD"))
        parser.add_argument("--if-missing", action="store_true", help="do nothing if the user exists")

    def handle(self, username, email, password, if_missing, **_):
        if get_user_model().objects.filter(username=username).exists():
            if if_missing:
                self.stdout.write(f"user {username!r} exists; left as it is")
                return
            raise CommandError(f"user {username!r} already exists")
        if not password:
            raise CommandError("give --password or set RFTWEB_ADMIN_PASSWORD")
        create_user(username, password, email=email, is_superuser=True)
        self.stdout.write(self.style.SUCCESS(f"created admin {username!r}"))
