"""The text filters (apps/core/templatetags/text.py): `ticks`, backquoted names as <code>, the rest
escaped; `thousands`, counts as people read them."""
from datetime import timedelta

from django.utils import timezone

from apps.core.templatetags.text import ago, thousands, ticks


def test_backquoted_words_become_code_and_nothing_else_is_markup():
    assert ticks("a `train` worker: celery -A rftweb worker -Q `train`") == (
        "a <code>train</code> worker: celery -A rftweb worker -Q <code>train</code>")
    assert ticks("<b>`x<y`</b> and ` alone") == "&lt;b&gt;<code>x&lt;y</code>&lt;/b&gt; and ` alone"


def test_thousands_separates_counts_and_leaves_other_values_alone():
    assert (thousands(15696), thousands(7), thousands("about 10001"), thousands(None)) == (
        "15,696", "7", "about 10001", "None")


def test_ago_says_just_now_under_a_minute_and_how_long_after():
    """The sweep page said "created 0 minutes ago" right after its launch."""
    now = timezone.now()
    assert ago(now - timedelta(seconds=5)) == "just now"
    assert ago(now - timedelta(minutes=3, seconds=5)) == "3\xa0minutes ago"
    assert ago(None) == ""
