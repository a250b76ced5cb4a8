#!/usr/bin/python3
"""The medians of repeated bench runs, with their ranges, run by test/bench/run.sh.

    summarize.py LABEL=RUN.json... [LABEL=RUN.json...]

Each argument is one run of bench.py (its BENCH_JSON) under a label: the
build it ran (`head`, or `base` with BENCH_BASE).  For each workload and
system: the median throughput over the runs of a label, its range, the
executors' CPU per step and the machine's CPU per job (medians), and the
most CPU other processes took during a run of it (a warning past 0.2
cores).  With two labels, their medians side by side and head / base.
"""
import json
import statistics
import sys

THROUGHPUT = ("w1", "w3", "w4", "w5", "w6")
COMPETITION_WARN_CORES = 0.2


def load(arguments):
    runs = {}
    for argument in arguments:
        label, path = argument.split("=", 1)
        with open(path) as f:
            runs.setdefault(label, []).append(json.load(f)["results"])
    return runs


def figures(results_of_runs):
    """{(workload, system): {"values": [...], "cpu_step": [...], "cpu_job": [...], "others": [...]}}."""
    out = {}
    for results in results_of_runs:
        for wl in THROUGHPUT:
            for system, (value, r) in results.get(wl, {}).items():
                f = out.setdefault((wl, system), {"values": [], "cpu_step": [], "cpu_job": [], "others": []})
                f["values"].append(value)
                for key, name in (("cpu_us_per_step", "cpu_step"), ("machine_cpu_us_per_job", "cpu_job"),
                                  ("others_cores", "others")):
                    if r.get(key) is not None:
                        f[name].append(r[key])
        for system, r in results.get("w2", {}).items():
            f = out.setdefault(("w2 p99 ms", system), {"values": [], "cpu_step": [], "cpu_job": [], "others": []})
            f["values"].append(r["insert_await_ms"]["p99"])
    return out


def median(values):
    return statistics.median(values) if values else None


def cell(f):
    if f is None or not f["values"]:
        return "-"
    m = median(f["values"])
    text = f"{m:,.0f} [{min(f['values']):,.0f}-{max(f['values']):,.0f}]" if m >= 100 else \
        f"{m:.2f} [{min(f['values']):.2f}-{max(f['values']):.2f}]"
    if f["cpu_step"]:
        text += f" exec {median(f['cpu_step']):.0f} us/step"
    if f["cpu_job"]:
        text += f" machine {median(f['cpu_job']):.0f} us/job"
    if f["others"] and max(f["others"]) > COMPETITION_WARN_CORES:
        text += f" (WARNING: others up to {max(f['others']):.2f} cores)"
    return text


def main():
    runs = load(sys.argv[1:])
    labels = sorted(runs, key=lambda label: label != "base")   # base first
    per_label = {label: figures(runs[label]) for label in labels}
    keys = sorted({k for f in per_label.values() for k in f})
    print()
    print("medians of " + ", ".join(f"{len(runs[label])} runs of {label}" for label in labels)
          + " (systems interleaved in each run" + (", builds alternated" if len(labels) > 1 else "")
          + "), [range]; CPU medians")
    for wl, system in keys:
        row = [f"{wl.upper():<10} {system:<9}"]
        for label in labels:
            row.append(f"{label}: {cell(per_label[label].get((wl, system)))}")
        if len(labels) == 2:
            a, b = (per_label[label].get((wl, system)) for label in labels)
            if a and b and a["values"] and b["values"] and median(a["values"]):
                row.append(f"{labels[1]} / {labels[0]} {median(b['values']) / median(a['values']):.2f}")
        print("  " + "   ".join(row))


if __name__ == "__main__":
    main()
