"""The latest figures of every benchmark as one markdown table, from bench/results/*.json.

    python -m bench.summary            # print
    python -m bench.summary --write    # also bench/results/latest.md
"""
import json
import sys

from bench.common import RESULTS


def read(name):
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def rows() -> list[tuple[str, str, str, str, str]]:
    """(benchmark, figure, rftweb, baseline / aim, load)"""
    out = []
    grpo_rows = []
    files = [json.loads(path.read_text()) for path in RESULTS.glob("grpo_step*.json")]
    checks_seen = set()
    for data in sorted(files, key=lambda d: d.get("finished", ""), reverse=True):  # newest first
        for row in (data or {}).get("rows", []):
            key = (row["case"], row["dtype"])
            if key not in [(r["case"], r["dtype"]) for r in grpo_rows]:
                grpo_rows.append(row)
        for case, check in (data or {}).get("checks", {}).items():
            if case in checks_seen:
                continue
            checks_seen.add(case)
            out.append(("grpo loss check", f"{case}: loss TRL vs rftweb; grad rel diff",
                        f"{check['rftweb_loss']:.6g} vs {check['trl_loss']:.6g}; {check['grad_rel_diff']:.1e}",
                        "equal" if check["equal"] else "MISMATCH", ""))
    aims = {"tiny": 0.5, "smollm2": 0.75}
    schedules = {"rftweb": "offset 0, sequential", "rftweb_offset1": "offset 1, overlapped"}
    for row in grpo_rows:
        for side, schedule in schedules.items():
            name = f"{row['case']} {row['dtype']}"
            out.append(("grpo_step", f"{name} wall s/step, rftweb {schedule} (explore, train)",
                        f"{row[f'{side}_step_s']:.2f} ({row[f'{side}_explore_s']:.2f}, {row[f'{side}_train_s']:.2f})",
                        f"TRL {row['trl_step_s']:.2f}; ratio {row[f'{side}_ratio']:.2f} (aim <= {aims[row['case']]})",
                        row["load"]))
            out.append(("grpo_step", f"{name} CPU s/step, rftweb {schedule}", f"{row[f'{side}_cpu_s']:.2f}",
                        f"TRL {row['trl_cpu_s']:.2f}; ratio {row[f'{side}_cpu_ratio']:.2f}", row["load"]))
    data = read("learning")
    if data and "summary" in data:
        s = data["summary"]
        quarters = {side: f"{v['first_quarter']:.3f} -> {v['last_quarter']:.3f}" for side, v in s.items()}
        out.append(("learning", f"{data['case']}, {data['steps']} steps x {data['seeds']} seeds, "
                    f"reward {data['reward']}: mean reward 1st -> last quarter",
                    f"offset 0: {quarters['rftweb']}; offset 1: {quarters['rftweb_offset1']}",
                    f"TRL {quarters['trl']}", data["machine"]["load"]))
    data = read("rollout")
    if data and data.get("summary"):
        base = next((r for r in data["summary"] if r["engine"] == "hf_generate"), None)
        for r in data["summary"]:
            if r["engine"] == "hf_generate":
                continue
            shape = f"{data['prompts']}x{data['samples']}x{data['tokens']}"
            versus = f"HF generate {base['tokens_per_s']:.1f}; x{r['vs_hf_generate']:.2f}" if base else ""
            out.append(("rollout", f"{r['engine']} tokens/s ({data['model']}, {shape})",
                        f"{r['tokens_per_s']:.1f}", versus, data.get("load_end", "")))
        for engine, err in data.get("failures", {}).items():
            out.append(("rollout", f"{engine}", "failed", err[:60], ""))
    data = read("stack_overhead")
    if data and "summary" in data:
        s = data["summary"]
        out.append(("stack_overhead", "tiny GRPO s/step, full stack vs headless", f"{s['stack_s']:.2f}",
                    f"headless {s['headless_s']:.2f}; overhead {s['overhead'] * 100:+.1f}% (aim < 5%)", s["load_end"]))
        storage = {k: v for k, v in data["profile"]["ms_per_step"].items() if not k.startswith("loop.")}
        loop_ms = sum(v for k, v in data["profile"]["ms_per_step"].items() if k.startswith("loop."))
        total = sum(storage.values())
        top = ", ".join(f"{k} {v:.0f}" for k, v in list(storage.items())[:4])
        out.append(("stack_overhead", "storage ms/step inside the loop (in-process profile)", f"{total:.0f} ms",
                    f"{total / max(loop_ms, 1) * 100:.1f}% of the step; top: {top}", ""))
    data = read("buffer")
    if data and "write_per_s" in data:
        floor = data.get("write_floor_per_s")
        out.append(("buffer", "writes/s (128-row batches, 512-token arrays), one writer", f"{data['write_per_s']:.0f}",
                    f"bare table {floor:.0f}/s; aim 20,000" if floor else "aim 20,000", data["machine"]["load"]))
        for key, figures in data.items():
            if key.startswith("writers_"):
                writers = key.removeprefix("writers_")
                out.append(("buffer", f"sample(256) p50 / p95 ms at {data['rows']:,} rows, {writers} writers",
                            f"{figures['sample_p50_ms']:.0f} / {figures['sample_p95_ms']:.0f}",
                            f"writers {figures['write_per_s']:.0f} exps/s", data.get("load_end", "")))
    data = read("live_metrics")
    if data:
        out.append(("live_metrics", f"commit -> websocket p50 / p95 / max ms, {data['clients']} clients",
                    f"{data['p50_ms']:.0f} / {data['p95_ms']:.0f} / {data['max_ms']:.0f}",
                    f"received {data['received']}/{data['expected']} (0.25 s coalescing included)",
                    data.get("load_end", "")))
    data = read("memory")
    if data:
        out.append(("memory", "peak RSS MB, SmolLM2: explorer / trainer / loop",
                    f"{data['explorer_mb']:.0f} / {data['trainer_mb']:.0f} / {data['loop_mb']:.0f}",
                    f"TRL {data['trl_mb']:.0f}", data.get("load_end", "")))
    data = read("weight_sync")
    if data and data.get("summary"):
        by = {r["method"]: r for r in data["summary"]}
        for method, r in by.items():
            parts = ", ".join(f"{k} {v:.0f}" for k, v in r["parts_ms"].items())
            out.append(("weight_sync", f"{data['model']} ms per version, {method} ({parts})",
                        f"{r['per_version_ms']:.0f}", f"first version {r['first_ms']:.0f}", data.get("load_end", "")))
    data = read("explorers")
    if data and data.get("summary"):
        for r in data["summary"]:
            versus = f"x{r['vs_one']:.2f} of 1 explorer" if r.get("vs_one") and r["explorers"] > 1 else ""
            out.append(("explorers", f"{data['model']} rollouts/s; s/trainer step, sync {r['method']}, "
                        f"{r['explorers']} explorer(s)", f"{r['rollouts_per_s']:.2f}; {r['s_per_step']:.1f}", versus,
                        data.get("load_end", "")))
    return out


def markdown() -> str:
    lines = ["| benchmark | figure | rftweb | baseline / aim | load (1/5/15 min) |", "| --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows()]
    return "\n".join(lines)


if __name__ == "__main__":
    text = markdown()
    print(text)
    if "--write" in sys.argv:
        (RESULTS / "latest.md").write_text(text + "\n")
