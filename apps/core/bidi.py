"""A name people gave, isolated for text that cannot hold a <bdi>: a flash message, a page's
<title>, an <option>, a chart's hover (Plotly draws SVG text). FSI (U+2068) ... PDI (U+2069) is what
<bdi> does for text: a right-to-left override (U+202E) in the name ends at the PDI; without it,
the override runs to the end of the line and lays out backwards what follows the name (the "."
of "Stopping <name>.", a title's " · rftweb", an option's "#id", a hover's value). A message
keeps the marks until the page shows it: the `ticks` filter makes each such name a <bdi>.
static/js/bidi.js does the same in the browser.

A PDI of the name's own that closes nothing in it would close ours, letting an override after it
out again: it is dropped. An isolate the name opens and never closes would take our PDI: it is
closed before ours."""

FSI, PDI = "\u2068", "\u2069"
OPENS = frozenset("\u2066\u2067\u2068")  # LRI, RLI, FSI: each closed by a PDI


def isolate(name) -> str:
    """str(name) between FSI and PDI, its own isolates balanced within it."""
    return FSI + balanced(name) + PDI


def balanced(name) -> str:
    """str(name) without a PDI that closes nothing in it, and with the isolates it leaves open closed:
    what a <bdi> holds (the `bdi` filter), since Chromium let a stray PDI close a <bdi>'s isolate too
    (`<bdi>evil\u2069\u202ename</bdi> #12` drew as "evil21# eman")."""
    kept, open_isolates = [], 0
    for character in str(name):
        if character in OPENS:
            open_isolates += 1
        elif character == PDI:
            if not open_isolates:
                continue
            open_isolates -= 1
        kept.append(character)
    return "".join(kept) + PDI * open_isolates


def split_isolated(text: str) -> list[tuple[str, bool]]:
    """text as (part, isolated) pairs in order: each FSI ... matching PDI at the top level (as
    isolate() writes a name) is one part without those two marks; the text between, and an FSI
    never closed, the others."""
    parts, start, depth, opened = [], 0, 0, 0
    for at, character in enumerate(text):
        if depth == 0 and character == FSI:
            parts.append((text[start:at], False))
            depth, opened = 1, at
        elif depth and character in OPENS:
            depth += 1
        elif depth and character == PDI:
            depth -= 1
            if depth == 0:
                parts.append((text[opened + 1:at], True))
                start = at + 1
    if depth:  # an FSI that nothing closed: not a name isolate() wrote
        start = opened
    parts.append((text[start:], False))
    return [(part, isolated) for part, isolated in parts if part or isolated]
