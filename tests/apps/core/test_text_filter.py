"""The `ticks` filter (apps/core/templatetags/text.py): backquoted names as <code>, the rest escaped."""
from apps.core.templatetags.text import ticks


def test_backquoted_words_become_code_and_nothing_else_is_markup():
    assert ticks("a `train` worker: celery -A rftweb worker -Q `train`") == (
        "a <code>train</code> worker: celery -A rftweb worker -Q <code>train</code>")
    assert ticks("<b>`x<y`</b> and ` alone") == "&lt;b&gt;<code>x&lt;y</code>&lt;/b&gt; and ` alone"
