"""`ticks`: text whose `backquoted` words are names to type (a queue, a key, a command), shown as
<code> rather than with the backquotes (messages said "a `train` worker" literally), and whose
names people gave, isolated (apps/core/bidi.isolate: a flash message's run name), are a <bdi> as
on the rest of the page (app.css wraps it; backquotes in it stay backquotes). `bdi`: a name people
gave, as a <bdi>. `isolate`: a name people gave where no element may hold it (a <title>, an
<option>, an attribute's text). `thousands`:
a count as 15,696, not 15696 (USE_THOUSAND_SEPARATOR would put commas in every id in a URL too).
`breakable`: a dotted or slashed name (algorithm.repeat_times, eval/exact_match) that may wrap
after its dots, slashes and colons, so that a table's header does not widen its column past its values.
`ago`: how long ago, "just now" under a minute (timesince said "0 minutes ago")."""
import re

from django import template
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import mark_safe
from django.utils.timesince import timesince

from apps.core.bidi import balanced, isolate, split_isolated

register = template.Library()
TICKED = re.compile(r"`([^`\n]+)`")
BREAK_AFTER = re.compile(r"([./:])")


@register.filter
def ticks(text) -> str:
    # Escaped first: only <code> and <bdi> are ours (FSI and PDI are no markup to escape).
    return mark_safe("".join(f"<bdi>{part}</bdi>" if isolated else TICKED.sub(r"<code>\1</code>", part)
                             for part, isolated in split_isolated(escape(str(text)))))


register.filter("isolate", isolate)


@register.filter
def bdi(name) -> str:
    """A name people gave, shown where it may be an element: a <bdi> (app.css wraps it), escaped,
    its own isolates balanced (bidi.balanced). Every template's names go through it."""
    return mark_safe(f"<bdi>{escape(balanced(name))}</bdi>")


@register.filter
def thousands(number) -> str:
    return f"{number:,}" if isinstance(number, int) else str(number)


@register.filter
def breakable(text) -> str:
    return mark_safe(BREAK_AFTER.sub(r"\1<wbr>", escape(str(text))))  # escaped first: only <wbr> is ours


@register.filter
def ago(moment) -> str:
    if not moment:
        return ""
    return "just now" if (timezone.now() - moment).total_seconds() < 60 else f"{timesince(moment)} ago"
