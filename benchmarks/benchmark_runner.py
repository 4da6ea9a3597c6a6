"""How benchmarks/benchmark_ops.py times a case: detcore, the baseline build (in a worker process)
and torchvision, call by call in turn so that all three see the same load, once per phase (quiet,
then with busy processes beside it); and the table it prints.
"""
import os

import benchmark_worker
from benchmark_timing import median, timed_ms


class Runner:
    """Times cases: detcore, the baseline build (in a worker) and torchvision, call by call."""

    def __init__(self, device, tv_budget_s, baseline=None, make_tv_worker=None):
        self.device = device
        self.tv_budget_s = tv_budget_s
        self.baseline = baseline  # benchmark_worker.Worker or None
        self.make_tv_worker = make_tv_worker
        self._tv_worker = None

    def close(self):
        for w in (self.baseline, self._tv_worker):
            if w is not None:
                w.close()

    def _baseline_call(self, case, want_digest=False):
        try:
            return self.baseline.call({"case": case.name, "impl": "detcore", "digest": want_digest})
        except benchmark_worker.WorkerError as e:
            raise RuntimeError(f"baseline: {e.reason}") from e

    def _tv_worker_call(self, case):
        """One torchvision call in the worker: its time in ms and its digest, or None past the budget."""
        if self._tv_worker is None:
            self._tv_worker = self.make_tv_worker()
        try:
            return self._tv_worker.call(
                {"case": case.name, "impl": "torchvision", "digest": True}, timeout_s=self.tv_budget_s
            )
        except benchmark_worker.WorkerTimeout:
            self._tv_worker = None  # killed; the next call starts another
            return None

    def check(self, case, row):
        """Runs each side once: agreement with torchvision and the bits of the baseline."""
        ours, _ = timed_ms(case.detcore_fn, self.device)
        row["tv_timed"] = False
        if case.torchvision_fn is None:
            row["agree"] = "n/a (no torchvision)"
        elif case.torchvision_in_worker:
            reply = self._tv_worker_call(case)
            if reply is None:
                row["agree"] = f"n/a (torchvision over {self.tv_budget_s:g} s)"
            else:
                same = reply["digest"] == benchmark_worker.digest(ours)
                row["agree"] = "yes" if same else "NO (different indices)"
                row["tv_timed"] = True
        else:
            theirs, first_ms = timed_ms(case.torchvision_fn, self.device)
            row["agree"] = case.agree_fn(ours, theirs)
            row["tv_timed"] = first_ms * (case.repeats + 2) <= self.tv_budget_s * 1000
            if not row["tv_timed"]:
                row["note"] = (
                    f"one torchvision call took {first_ms:.0f} ms: its repeats exceed the "
                    f"{self.tv_budget_s:g} s budget"
                )
        if self.baseline is not None:
            try:
                reply = self._baseline_call(case, want_digest=True)
                row["same_bits_as_baseline"] = (
                    "yes" if reply["digest"] == benchmark_worker.digest(ours) else "NO"
                )
            except RuntimeError as e:
                row["same_bits_as_baseline"] = f"n/a ({e})"

    def measure(self, case, row):
        """Median times of the three sides, interleaved call by call, with the load average."""
        with_baseline = self.baseline is not None and row.get("same_bits_as_baseline") in ("yes", "NO")
        tv_here = row["tv_timed"] and not case.torchvision_in_worker
        load_before = os.getloadavg()[0]
        for _ in range(2 if case.repeats > 3 else 1):  # warm-up
            case.detcore_fn()
            if with_baseline:
                self._baseline_call(case)
            if tv_here:
                case.torchvision_fn()
        ours, base, theirs = [], [], []
        for _ in range(case.repeats):
            ours.append(timed_ms(case.detcore_fn, self.device)[1])
            if with_baseline:
                base.append(self._baseline_call(case)["ms"])
            if tv_here:
                theirs.append(timed_ms(case.torchvision_fn, self.device)[1])
        result = {"detcore_ms": median(ours), "baseline_ms": median(base)}
        if tv_here:
            result["torchvision_ms"] = median(theirs)
        elif case.torchvision_in_worker and row["tv_timed"]:
            reply = self._tv_worker_call(case)  # one call: it may take most of the budget
            result["torchvision_ms"] = reply["ms"] if reply else f"> {self.tv_budget_s:g} s"
        else:
            result["torchvision_ms"] = None if case.torchvision_fn is None else "skipped"
        tv_ms, base_ms = result["torchvision_ms"], result["baseline_ms"]
        result["speedup"] = tv_ms / result["detcore_ms"] if isinstance(tv_ms, float) else None
        result["baseline_over_detcore"] = base_ms / result["detcore_ms"] if base_ms else None
        result["loadavg_1min"] = [load_before, os.getloadavg()[0]]
        return result

    def run(self, case, loads):
        """The row of a case: one check, then one measurement per (phase name, BackgroundLoad)."""
        row = {"case": case.name, "repeats": case.repeats}
        self.check(case, row)
        for phase, load in loads:
            if load is None:
                row[phase] = self.measure(case, row)
            else:
                with load:
                    row[phase] = self.measure(case, row)
        del row["tv_timed"]
        return row


def _fmt(value, digits=3):
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{value:.{digits}f}"


def _ratio(value):
    return _fmt(value, 2) + ("x" if isinstance(value, float) else "")


def print_table(rows, phases, with_baseline):
    headers = ["case"]
    for phase in phases:
        p = "" if len(phases) == 1 else f"{phase}: "
        headers += [f"{p}detcore ms"]
        headers += [f"{p}baseline ms", f"{p}baseline/detcore"] if with_baseline else []
        headers += [f"{p}torchvision ms", f"{p}speedup", f"{p}load"]
    headers += ["agree"] + (["bits = baseline"] if with_baseline else [])
    table = []
    for r in rows:
        line = [r["case"]]
        for phase in phases:
            m = r[phase]
            line += [_fmt(m["detcore_ms"])]
            line += [_fmt(m["baseline_ms"]), _ratio(m["baseline_over_detcore"])] if with_baseline else []
            line += [_fmt(m["torchvision_ms"]), _ratio(m["speedup"]), f"{m['loadavg_1min'][1]:.1f}"]
        line += [r["agree"]] + ([r.get("same_bits_as_baseline", "-")] if with_baseline else [])
        table.append(line)
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *table)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    print(line)
    print("-" * len(line))
    for r in table:
        print("  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]))
