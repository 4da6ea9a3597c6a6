"""What scripts/gpu_check.sh writes: OUT_DIR/gpu_check.json (every step and part, with status,
time and notes; the machine; the benchmark and training figures) and OUT_DIR/gpu_check.md (the
same as a summary ready to paste into docs/benchmarks.md), both rewritten after every step so
that a run cut short still leaves what it found. Standard library only.
"""
import json
import os
from typing import Dict, List, Optional

SCHEMA = 1


def write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def report_dict(state: Dict, steps: List) -> Dict:
    """The JSON document: state (mode, times, machine, figures) and the steps so far."""
    return {"schema": SCHEMA, **state, "steps": [s.as_dict() for s in steps]}


def write(out_dir: str, state: Dict, steps: List) -> Dict:
    doc = report_dict(state, steps)
    write_atomic(os.path.join(out_dir, "gpu_check.json"), json.dumps(doc, indent=2, default=str) + "\n")
    write_atomic(os.path.join(out_dir, "gpu_check.md"), markdown(doc))
    return doc


# ------------------------------------------------------------------------------------ markdown
def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(headers: List[str], rows: List[List]) -> List[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _ms(value) -> str:
    if isinstance(value, (int, float)):
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    return "-" if value is None else str(value)


def _ratio(value) -> str:
    return f"{value:.2f}x" if isinstance(value, (int, float)) else "-"


def ops_table(ops: Dict) -> List[str]:
    """benchmarks/benchmark_ops.py's JSON (its quiet phase) as a table."""
    rows = []
    for r in ops.get("results", []):
        m = r.get("quiet") or {}
        rows.append([r["case"], _ms(m.get("detcore_ms")), _ms(m.get("torchvision_ms")), _ratio(m.get("speedup")), r.get("agree", "-")])
    return _table(["case", "detcore ms", "torchvision ms", "speedup (tv / detcore)", "agree"], rows)


MODEL_ROWS = [
    ("inference total, ms", "infer", "total_ms"),
    ("training step (2 images), ms", "train", "total_ms"),
    ("peak memory, inference, MiB", "infer", "peak_memory_mb"),
    ("peak memory, training step, MiB", "train", "peak_memory_mb"),
]
MODEL_COLUMNS = [
    ("detcore", "detcore fp32"),
    ("detcore_bfloat16", "detcore bf16 AMP"),
    ("torchvision", "torchvision fp32"),
    ("torchvision_bfloat16", "torchvision bf16 AMP"),
]


def model_table(model: Dict) -> List[str]:
    """benchmarks/benchmark_model.py's JSON as a table: one column per framework and precision."""
    results = model.get("results", {})
    columns = [(key, label) for key, label in MODEL_COLUMNS if key in results]
    rows = []
    for label, phase, field in MODEL_ROWS:
        values = [results[key].get(phase, {}).get(field) for key, _ in columns]
        if any(v is not None for v in values):
            rows.append([label] + [_ms(v) for v in values])
    return _table([""] + [label for _, label in columns], rows)


def host_syncs_lines(syncs: Dict) -> List[str]:
    """The host syncs of one training iteration (tests/modeling/test_model_value_checks.py)."""
    lines = [f"Host syncs of one training iteration, {syncs.get('model', '?')}: {syncs.get('total')} "
             f"({syncs.get('forward')} in the forward, {syncs.get('backward')} in the backward). "
             "The forward's, by op:", ""]
    rows = [[op, count] for op, count in syncs.get("forward_by_op", {}).items()]
    if syncs.get("forward_outside_ops"):
        rows.append(["(outside any op)", syncs["forward_outside_ops"]])
    lines += _table(["op", "syncs"], rows)
    calls = syncs.get("detcore_ops", {})
    if calls:
        lines += ["", "detcore's calls: " + ", ".join(
            f"{op} {c['calls']}x ({c['syncs']} syncs, {c['checked']} checked)" for op, c in sorted(calls.items()))]
    return lines


def _status(step: Dict) -> str:
    return {"passed": "passed", "failed": "**FAILED**", "skipped": "skipped"}.get(step["status"], step["status"])


def _notes(step: Dict) -> str:
    notes = []
    for p in step["parts"]:
        if p["status"] != "passed" or p.get("note"):
            text = f"{p['name']}: {p['status']}"
            notes.append(text + (f" ({p['note']})" if p.get("note") else ""))
    return "; ".join(notes)


def markdown(doc: Dict) -> str:
    machine = doc.get("machine", {})
    rehearsal = doc.get("mode") == "rehearse"
    title = "GPU check rehearsal (CPU)" if rehearsal else f"GPU check: {machine.get('gpu', 'unknown GPU')}"
    lines = [f"### {title}, {doc.get('date', '')}", ""]
    facts = [
        ("machine", machine.get("host")),
        ("GPU", machine.get("gpu")),
        ("driver", machine.get("driver")),
        ("CPU", machine.get("cpu")),
        ("torch", machine.get("torch")),
        ("CUDA (torch)", machine.get("torch_cuda")),
        ("nvcc", machine.get("nvcc")),
        ("python", machine.get("python")),
        ("detcore commit", machine.get("commit")),
        ("TORCH_CUDA_ARCH_LIST", machine.get("arch_list")),
    ]
    lines += [f"- {k}: {v}" for k, v in facts if v]
    total = doc.get("seconds")
    lines.append(f"- wall time: {total:.0f} s of a {doc.get('budget_s', 0):.0f} s budget" if total is not None else "- wall time: (run not finished)")
    lines.append("")
    rows = [[i + 1, s["title"], _status(s), f"{s['seconds']:.0f} s", f"{s.get('cpu_seconds', 0):.0f} s", _notes(s)]
            for i, s in enumerate(doc["steps"])]
    lines += _table(["#", "step", "status", "time", "CPU time", "notes"], rows)
    lines.append("")
    lines.append("Steps 2-4 run at once: their times overlap. CPU time: user + system of the step's commands.")
    figures = doc.get("figures", {})
    if figures.get("ops"):
        ops = figures["ops"]
        quick = " --quick" if ops.get("quick") else ""
        lines += ["", f"Ops, detcore against torchvision on {ops.get('device_name', '?')} (median of {ops.get('repeats', '?')} calls, "
                      f"`benchmarks/benchmark_ops.py --device {ops.get('device', '?')}{quick}`):", ""]
        lines += ops_table(ops)
    if figures.get("model"):
        model = figures["model"]
        h, w = model.get("image", ["?", "?"])
        lines += ["", f"R-50-FPN Mask R-CNN, {h}x{w}, inference 1 image, training step 2 images, on {model.get('device_name', '?')} "
                      f"(`benchmarks/benchmark_model.py`, {model.get('memory', 'peak memory')}):", ""]
        lines += model_table(model)
    if figures.get("host_syncs"):
        lines += [""] + host_syncs_lines(figures["host_syncs"])
    if figures.get("training"):
        t = figures["training"]
        lines += ["", f"Shapes R-18 Mask R-CNN ({t.get('iterations')} iterations, {t.get('precision')}, seed {t.get('seed')}): "
                      f"box AP {_ap(t.get('box_ap'))}, mask AP {_ap(t.get('mask_ap'))}"
                      + (f", {t['seconds_per_iter']:.3f} s/it" if t.get("seconds_per_iter") else "")
                      + (f"; the CPU recipe at the same schedule: {t['reference']}" if t.get("reference") else "")]
    return "\n".join(lines) + "\n"


def _ap(value: Optional[float]) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"
