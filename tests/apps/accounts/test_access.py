"""Every page needs a login; roles limit who reaches what."""
import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from apps.runs.models import Run
from apps.tasksets.models import Taskset

PUBLIC = ("login", "logout", "favicon")  # the login page shows the icon too


def all_page_urls(kwargs_for) -> list[str]:
    """Every URL the project serves outside the admin and login, with its parameters filled in."""
    urls = []

    def walk(patterns, prefix):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                if str(pattern.pattern).startswith(("admin/",)):
                    continue
                walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern) and pattern.name not in PUBLIC:
                route = prefix + str(pattern.pattern)
                urls.append("/" + fill(route, kwargs_for))

    walk(get_resolver().url_patterns, "")
    return urls


def fill(route: str, kwargs_for) -> str:
    import re

    return re.sub(r"<(?:(\w+):)?(\w+)>", lambda m: str(kwargs_for(m.group(1) or "str", m.group(2))), route)


@pytest.fixture
def objects(researcher):
    run = Run.objects.create(name="r", owner=researcher, config={})
    taskset = Taskset.objects.create(name="ts")
    return {"int": run.pk, "slug": taskset.name, "str": taskset.name, "path": "x"}


def test_url_walk_finds_the_pages(objects):
    urls = all_page_urls(lambda conv, name: objects[conv])
    assert "/" in urls and f"/runs/{objects['int']}/" in urls and "/tasksets/ts/" in urls


def test_anonymous_users_are_sent_to_login_from_every_page(client, objects):
    for url in all_page_urls(lambda conv, name: objects[conv]):
        response = client.get(url)
        if response.status_code == 405:  # a POST- or DELETE-only endpoint: try it the way it is used
            response = getattr(client, response["Allow"].split(", ")[0].lower())(url)
        if response.status_code == 401:  # API clients get a status, not a login page
            assert url.startswith("/api/") and response["Content-Type"] == "application/json", url
            continue
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login")), url


def test_the_icon_is_public(client, db):
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"].endswith("favicon.svg")


def test_anonymous_admin_goes_to_login(client, db):
    response = client.get("/admin/buffer/experience/")
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_annotator_cannot_reach_researcher_pages(annotator_client, objects):
    for url in ["/runs/", f"/runs/{objects['int']}/", "/tasksets/", "/tasksets/ts/"]:
        assert annotator_client.get(url).status_code == 403, url
    assert annotator_client.get("/").status_code == 200  # their own home


def test_annotator_and_researcher_cannot_reach_the_curator_admin(client, annotator, researcher):
    for user in (annotator, researcher):
        client.force_login(user)
        response = client.get("/admin/buffer/experience/")
        assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_curator_works_in_the_admin(client, curator):
    client.force_login(curator)
    assert client.get("/admin/buffer/experience/").status_code == 200
    assert client.get("/admin/auth/user/").status_code == 403  # but does not manage users


def test_researcher_reaches_researcher_pages(researcher_client, objects):
    for url in ["/", "/runs/", f"/runs/{objects['int']}/", "/tasksets/", "/tasksets/ts/"]:
        assert researcher_client.get(url).status_code == 200, url


def test_login_page_and_login(client, researcher):
    assert client.get(reverse("login")).status_code == 200
    response = client.post(reverse("login"), {"username": "res", "password": "pw-for-tests-123"})
    assert response.status_code == 302
    assert client.get("/").status_code == 200


def test_create_admin_command(db):
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.core.management.base import CommandError

    call_command("create_admin", "--username", "boss", "--password", "a-long-password-1")
    boss = get_user_model().objects.get(username="boss")
    assert boss.is_superuser and boss.check_password("a-long-password-1")
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_admin", "--username", "boss", "--password", "x")
    call_command("create_admin", "--username", "boss", "--password", "x", "--if-missing")


def test_a_refused_page_says_why_and_keeps_the_nav(annotator_client, annotator):
    """Issue #42, finding 9: annotators got a bare "403 Forbidden" page on researcher pages."""
    response = annotator_client.get(reverse("run-list"))
    assert response.status_code == 403
    html = response.content.decode()
    assert "This page needs the researcher role." in html
    assert f"logged in as <strong><bdi>{annotator.username}</bdi></strong>" in html
    assert "with the role annotator" in html
    assert f'href="{reverse("annotate-start")}"' in html and 'class="topbar"' in html
