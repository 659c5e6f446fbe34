"""Names isolated where no <bdi> may go (apps/core/bidi.py), and flash messages that carry them
(the `ticks` filter): a right-to-left override in a name ends with the name, and the name stays
escaped text."""
from django.urls import reverse

from apps.core.bidi import FSI, PDI, isolate, split_isolated
from apps.core.templatetags.text import bdi, ticks
from apps.runs.models import Run

RLO = "\u202e"


def test_a_name_is_isolated_between_fsi_and_pdi():
    assert isolate("lr low") == FSI + "lr low" + PDI
    assert isolate(RLO + "evil") == FSI + RLO + "evil" + PDI  # the override ends at our PDI
    assert isolate(7) == FSI + "7" + PDI


def test_the_names_own_isolates_cannot_close_or_take_ours():
    # Its PDI that closes nothing would close our FSI and let the override after it out: dropped.
    assert isolate("a" + PDI + RLO + "b") == FSI + "a" + RLO + "b" + PDI
    # Its FSI (or RLI, LRI) never closed would take our PDI: closed first.
    assert isolate("\u2067a" + RLO) == FSI + "\u2067a" + RLO + PDI + PDI
    # Balanced ones stay as they are.
    assert isolate("a" + FSI + "b" + PDI + "c") == FSI + "a" + FSI + "b" + PDI + "c" + PDI


def test_split_isolated_finds_the_names_isolate_wrote():
    text = f"Could not stop {isolate('a' + FSI + 'b' + PDI)} ({isolate('cur')}) or {FSI}x"
    assert split_isolated(text) == [("Could not stop ", False), ("a" + FSI + "b" + PDI, True), (" (", False),
                                    ("cur", True), (") or ", False), (FSI + "x", False)]
    assert split_isolated("") == [] and split_isolated(isolate("")) == [("", True)]


def test_a_flash_message_shows_each_isolated_name_as_escaped_text_in_a_bdi():
    name = RLO + "<b>x</b>`queue`<script>alert(1)</script>"
    shown = ticks(f"Stopping {isolate(name)} on a `train` worker.")
    assert shown == ("Stopping <bdi>\u202e&lt;b&gt;x&lt;/b&gt;`queue`&lt;script&gt;alert(1)&lt;/script&gt;</bdi> "
                     "on a <code>train</code> worker.")  # backquotes in a name are part of the name
    # A raw FSI that nothing closes (a name a service put in an error as it is) is text, not a <bdi>.
    assert ticks(f"no run {FSI}<i>") == f"no run {FSI}&lt;i&gt;"


# ---- on the pages ----------------------------------------------------------------------------

# As long as a run's name may be (200), the word after the markup too long for any line.
EVIL = RLO + "<b>x</b>" + "w" * 191
EVIL_SHOWN = RLO + "&lt;b&gt;x&lt;/b&gt;" + "w" * 191


def test_the_stop_flash_and_the_run_pages_title_isolate_its_name(researcher_client, make_run):
    run = make_run(EVIL, status=Run.Status.RUNNING)
    page = researcher_client.post(reverse("run-stop", args=[run.pk]), follow=True).content.decode()
    assert f'<div class="flash success">Stopping <bdi>{EVIL_SHOWN}</bdi>.</div>' in page
    assert f"<title>{FSI}{EVIL_SHOWN}{PDI} · rftweb</title>" in page
    assert f'data-confirm="Stop {FSI}{EVIL_SHOWN}{PDI}? ' in page  # its worker still holds it: Stop shows
    assert "<b>x" not in page


def test_a_run_in_a_select_is_isolated_from_its_number(client, curator, annotator, make_run):
    run = make_run(EVIL, status=Run.Status.RUNNING)
    client.force_login(curator)
    page = client.get(reverse("person-detail", args=[annotator.pk])).content.decode()
    assert f'<option value="{run.pk}">{FSI}{EVIL_SHOWN}{PDI} #{run.pk}</option>' in page
    assert f"<title>{FSI}{annotator.username}{PDI} · people · rftweb</title>" in page


def test_a_stray_pdi_in_a_name_cannot_close_its_bdi_on_any_page(researcher_client, make_run):
    """Chromium let a name's own PDI close the <bdi> around it: `<bdi>evil\u2069\u202ename</bdi> #12`
    drew as "evil21# eman". Every template shows names through the `bdi` filter, which drops it."""
    assert bdi("a" + PDI + RLO + "<b>") == "<bdi>a" + RLO + "&lt;b&gt;</bdi>"
    assert bdi("\u2067a") == "<bdi>\u2067a" + PDI + "</bdi>"  # one left open is closed inside
    run = make_run("evil" + PDI + RLO + "name", status=Run.Status.RUNNING)
    page = researcher_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert f"<bdi>evil{RLO}name</bdi>" in page and f"<bdi>evil{PDI}" not in page
    listed = researcher_client.get(reverse("run-list")).content.decode()
    assert f"<bdi>evil{RLO}name</bdi>" in listed and f"<bdi>evil{PDI}" not in listed
