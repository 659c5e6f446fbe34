"""What the costliest config text costs the server: CPU seconds to read and check it, alone and four at once.

    python -m bench config_cost [--quick]
    python -m bench config_parse [--against REV]   # RunConfig.from_dict, here and at REV

Each text is 262,139 characters (at most MAX_CONFIG_CHARS, as in issue #41), of one shape that
makes much work per byte: many nodes (tiny keys, one-character items, empty lists), lists nested
63 deep, one long string; in YAML, and in JSON (which the reader takes with json.loads). A row is
the CPU seconds (process time) of `parse_config_text` then `RunConfig.from_dict`, the engine's
reading and checking, which every entry point runs (API, CLI, the launch form's YAML box, `base`
and reward_fn fields): best of 3 in this process, with torch and the engine imported. Then four
children read the costliest shape at the same moment (each waits for the others' imports): each
child's CPU seconds and the wall time of the four. Figures, not pass/fail; the bounds themselves
are tested by tests/security/test_round4_configs.py, by counting the work (events, nodes).
"""
import json
import os
import subprocess
import sys
import time

from bench.common import PY, ROOT, THREAD_ENV, load, machine, save, table

SIZE = 262_139  # issue #41's texts: the most MAX_CONFIG_CHARS (262,144) let through, less a margin
# dpo: it reads what the accepted text fills, feedback.source_runs (a grpo run reads none: refused).
HEAD = "model: {path: tiny}\nalgorithm: {name: dpo, repeat_times: 2}\nbuffer: {taskset: arith}\n"
JSON_HEAD = '{"model": {"path": "tiny"}, "buffer": {"taskset": "arith"}, '


def _filled(prefix: str, item, sep: str, suffix: str, size: int = SIZE) -> str:
    """prefix, then item(0), item(1), ... joined by sep, then suffix: as many items as fit in size
    characters; padded with spaces to exactly size."""
    parts, length = [], len(prefix) + len(suffix)
    while length + len(item(len(parts))) + len(sep) <= size:
        parts.append(item(len(parts)))
        length += len(parts[-1]) + len(sep)
    text = prefix + sep.join(parts) + suffix
    return text + " " * (size - len(text))


def worst_texts(size: int = SIZE) -> dict[str, str]:
    """{shape: config text of `size` characters}."""
    return {
        "yaml deep lists": _filled(HEAD + "x: [", lambda i: "[" * 62 + "]" * 62, ",", "]", size),
        "yaml empty lists": _filled(HEAD + "x: [", lambda i: "[]", ",", "]", size),
        "yaml 1-char items": _filled(HEAD + "x: [", lambda i: "F", ",", "]", size),
        "yaml block list": _filled(HEAD + "x:\n", lambda i: "- F", "\n", "\n", size),
        "yaml unknown keys": _filled("", lambda i: f"k{i}: 1", "\n", "\n", size),
        "yaml unknown reward fns": _filled(HEAD + "explorer: {reward_fn: {", lambda i: f"k{i}: 1", ",", "}}", size),
        "yaml long string": HEAD + "explorer: {system_prompt: " + "x" * (size - len(HEAD) - 27) + "}",
        "yaml most nodes, accepted": _most_nodes(size),
        "json empty lists": _filled(JSON_HEAD + '"x": [', lambda i: "[]", ",", "]}", size),
        "json unknown keys": _filled(JSON_HEAD, lambda i: f'"k{i}":1', ",", "}", size),
    }


def _most_nodes(size: int) -> str:
    """A config that is accepted with as many nodes as one may have (MAX_CONFIG_NODES; HEAD and the
    keys are 23 of them) and a long system prompt, padded to size."""
    ids = ",".join(str(i) for i in range(1, 10_000 - 23 + 1))
    text = HEAD + "explorer: {system_prompt: " + "x" * 99_000 + "}\nfeedback: {source_runs: [" + ids + "]}\n"
    return text + " " * (size - len(text))


def cost(text: str) -> tuple[float, str]:
    """(CPU seconds, outcome) of reading and checking text as every entry point does."""
    from workers.rft.config import ConfigError, RunConfig, parse_config_text

    started = time.process_time()
    try:
        RunConfig.from_dict(parse_config_text(text))
        outcome = "accepted"
    except ConfigError as err:
        outcome = str(err).splitlines()[0][:70]
    return time.process_time() - started, outcome


def child_main(shape: str) -> None:
    """One of the four: imports, says ready, waits for 'go' on stdin, reads, prints its CPU seconds."""
    import workers.rft.config  # noqa: F401  (the imports are not the request's cost)

    text = worst_texts()[shape]
    print("ready", flush=True)
    sys.stdin.readline()
    seconds, outcome = cost(text)
    print(json.dumps({"cpu_s": seconds, "outcome": outcome}), flush=True)


def concurrent(shape: str, n: int = 4) -> dict:
    """n children read `shape` at once: each one's CPU seconds, and the wall time until all answered."""
    children = [subprocess.Popen([PY, "-m", "bench.config_cost", shape], cwd=ROOT, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env={**os.environ, **THREAD_ENV})
                for _ in range(n)]
    for proc in children:
        assert proc.stdout.readline().strip() == "ready"
    started = time.perf_counter()
    for proc in children:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    answers = [json.loads(proc.stdout.readline()) for proc in children]
    wall = time.perf_counter() - started
    for proc in children:
        proc.wait()
    return {"shape": shape, "cpu_s": [a["cpu_s"] for a in answers], "wall_s": wall, "outcome": answers[0]["outcome"]}


def config_cost(quick: bool = False) -> dict:
    reps = 1 if quick else 3
    rows, results = [], {}
    for shape, text in worst_texts().items():
        runs = [cost(text) for _ in range(reps)]
        seconds, outcome = min(runs)
        results[shape] = {"cpu_s": [s for s, _ in runs], "outcome": outcome}
        rows.append([shape, seconds, outcome])
    print(table(rows, ["shape (262,139 chars)", "CPU s (best)", "outcome"]), flush=True)
    worst = max(results, key=lambda shape: min(results[shape]["cpu_s"]))
    four = concurrent(worst)
    print(f"\n4 at once, {worst}: CPU s {', '.join(f'{s:.3f}' for s in four['cpu_s'])}; "
          f"wall {four['wall_s']:.2f} s (load {load()})", flush=True)
    path = save("config_cost", {"machine": machine(), "shapes": results, "concurrent": four})
    print(f"-> {path}", flush=True)
    return {"shapes": results, "concurrent": four}


def parse_times(reps: int = 200) -> dict:
    """Milliseconds per `RunConfig.from_dict` (the median of reps) on each built-in preset and on
    the largest config accepted (MAX_CONFIG_NODES nodes and a 99,000-character system prompt, read
    once), in the tree this process imports."""
    from apps.runs.presets import PRESETS
    from workers.rft.config import RunConfig, parse_config_text

    configs = {name: preset.config for name, preset in PRESETS.items()}
    configs["largest accepted"] = parse_config_text(_most_nodes(SIZE))
    times = {}
    for name, config in configs.items():
        RunConfig.from_dict(config)
        runs = []
        for _ in range(reps if name != "largest accepted" else reps // 10):
            started = time.perf_counter()
            RunConfig.from_dict(config)
            runs.append(time.perf_counter() - started)
        times[name] = sorted(runs)[len(runs) // 2] * 1000
    return times


def config_parse(against: str | None = None) -> dict:
    """parse_times here and, side by side, in `against` (a git revision, unpacked by git archive),
    each in a child of this process."""
    import tempfile

    trees = {"this tree": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        if against:
            archive = subprocess.run(["git", "archive", against], cwd=ROOT, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            trees[against] = tmp
        found = {}
        for label, tree in trees.items():
            # this file times the tree on PYTHONPATH: its engine and presets
            out = subprocess.run([PY, __file__, "--parse"], cwd=tree, capture_output=True, text=True, check=True,
                                 env={**os.environ, **THREAD_ENV, "PYTHONPATH": str(tree)}).stdout
            found[label] = json.loads(out.splitlines()[-1])
    names = list(found["this tree"])
    rows = [[name, *(found[label].get(name, float("nan")) for label in trees)] for name in names]
    print(table(rows, ["config", *(f"ms, {label}" for label in trees)]), flush=True)
    path = save("config_parse", {"machine": machine(), "ms": found})
    print(f"-> {path}", flush=True)
    return found


if __name__ == "__main__":
    if sys.argv[1] == "--parse":
        print(json.dumps(parse_times()))
    else:
        child_main(sys.argv[1])
