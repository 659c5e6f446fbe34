// A name people gave, isolated for text that cannot hold a <bdi>: what Plotly draws (its hover,
// its legend: SVG text). As apps/core/bidi.py: FSI (U+2068) ... PDI (U+2069), the name's own
// isolates balanced inside, so a right-to-left override (U+202E) in it ends with it, not with the
// line (compare's hover: "<name> #<id> : <value>"). Chromium draws the two marks as nothing in SVG
// text too (tests/e2e/test_long_names.py measures the hover's width with and without them).
"use strict";
function isolate(name) {
  return "\u2068" + balanced(name) + "\u2069";
}
// The name's own isolates balanced, what a <bdi> holds (a stray PDI closed the <bdi> in Chromium).
function balanced(name) {
  let open = 0, kept = "";
  for (const character of String(name)) {
    if (character === "\u2066" || character === "\u2067" || character === "\u2068") open += 1; // LRI, RLI, FSI
    else if (character === "\u2069") { // PDI: one that closes nothing in the name would close ours
      if (!open) continue;
      open -= 1;
    }
    kept += character;
  }
  return kept + "\u2069".repeat(open);
}
