#!/usr/bin/env python3
"""Plans every published GPU measurement of tests/reference/gpu/measured.json with membill and
reports the difference: membill's figure against the one the source measured.

    compare.py MEMBILL [--markdown] [--check] [--rows ID,ID,...] [--bounds KIND=MEDIAN,WORST:...]

The figure compared is the one the source names: max_memory_allocated against membill's device
allocated_peak_bytes, max_memory_reserved against reserved_peak_bytes, nvidia-smi (or a figure
the source does not name, taken as what nvidia-smi shows) against reserved + the CUDA context.
Prints each row, then the median and worst absolute difference. --check: exit 1 when a row does
not plan (the data file and membill's options must stay in step); it judges no difference.
--rows: those rows alone. --bounds (with --check): exit 1 also when a kind's median or worst
absolute difference, in percent, is above its bound (inference=3,14:lora=9,11)."""
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
GIB = 1 << 30


def plan(membill, row):
    args = [membill] + row["membill"] + ["--config", os.path.join(HERE, row["config"]), "--json", "-", "--quiet"]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{row['id']}: membill exit {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def measured_bytes(row):
    return row["measured_mib"] * MIB if "measured_mib" in row else row["measured_gib"] * GIB


def membill_bytes(row, report):
    d = report["device"]
    if row["figure"] == "max_memory_allocated":
        return d["allocated_peak_bytes"], "allocated"
    if row["figure"] == "max_memory_reserved":
        return d["reserved_peak_bytes"], "reserved"
    return d["reserved_peak_bytes"] + d["context_bytes"], "reserved + context"


def parse_bounds(text):
    bounds = {}
    for part in text.split(":"):
        kind, _, vals = part.partition("=")
        median, _, worst = vals.partition(",")
        bounds[kind] = (float(median), float(worst))
    return bounds


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    membill, markdown, check = argv[1], "--markdown" in argv, "--check" in argv
    rows = json.load(open(os.path.join(HERE, "measured.json")))
    if "--rows" in argv:
        keep = set(argv[argv.index("--rows") + 1].split(","))
        rows = [r for r in rows if r["id"] in keep]
        if len(rows) != len(keep):
            print("compare.py: --rows names a row measured.json does not have", file=sys.stderr)
            return 2
    try:
        bounds = parse_bounds(argv[argv.index("--bounds") + 1]) if "--bounds" in argv else {}
    except (IndexError, ValueError):
        print("compare.py: --bounds KIND=MEDIAN,WORST[:KIND=MEDIAN,WORST...], in percent", file=sys.stderr)
        return 2
    diffs, kinds, failed = [], {}, 0
    if markdown:
        print("| row | measured | figure | membill | compared | difference |")
        print("|---|---:|---|---:|---|---:|")
    for row in rows:
        if not row.get("expressible", True):
            continue
        try:
            report = plan(membill, row)
        except RuntimeError as e:
            print(e, file=sys.stderr)
            failed += 1
            continue
        got, what = membill_bytes(row, report)
        want = measured_bytes(row)
        diff = (got - want) / want
        diffs.append(diff)
        kinds.setdefault(row["kind"], []).append(diff)
        fig = row["figure"].split(" ")[0]
        if markdown:
            print(f"| {row['id']} | {want / GIB:.2f} GiB | {fig} | {got / GIB:.2f} GiB | {what} | {100 * diff:+.1f}% |")
        else:
            print(f"{row['id']:28} measured {want / GIB:8.2f} GiB ({fig:21}) membill {got / GIB:8.2f} GiB "
                  f"({what:18}) {100 * diff:+6.1f}%")
    summary, over = [], []
    for k, v in [("all", diffs)] + sorted(kinds.items()):
        if v:
            a = [abs(x) for x in v]
            median, worst = 100 * statistics.median(a), 100 * max(a)
            summary.append(f"{k}: {len(v)} rows, median |difference| {median:.1f}%, "
                           f"worst {worst:.1f}%, median signed {100 * statistics.median(v):+.1f}%")
            if k in bounds and (median > bounds[k][0] or worst > bounds[k][1]):
                over.append(f"{k}: median {median:.1f}% worst {worst:.1f}%, bounds {bounds[k][0]}% and {bounds[k][1]}%")
    missing = [k for k in bounds if k not in kinds and k != "all"]
    print("\n" + "\n".join(summary))
    for line in over:
        print(f"compare.py: above its bounds: {line}", file=sys.stderr)
    for k in missing:
        print(f"compare.py: --bounds names {k}, which no row compared has", file=sys.stderr)
    return 1 if check and (failed or over or missing) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
