#!/usr/bin/env python3
"""Plans every published GPU measurement of tests/reference/gpu/measured.json with membill and
reports the difference: membill's figure against the one the source measured.

    compare.py MEMBILL [--markdown] [--check] [--rows ID,ID,...]

The figure compared is the one the source names: max_memory_allocated against membill's device
allocated_peak_bytes, max_memory_reserved against reserved_peak_bytes, nvidia-smi (or a figure
the source does not name, taken as what nvidia-smi shows) against reserved + the CUDA context.
Prints each row, then the median and worst absolute difference. --check: exit 1 when a row does
not plan (the data file and membill's options must stay in step); it judges no difference.
--rows: those rows alone."""
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
    summary = []
    for k, v in [("all", diffs)] + sorted(kinds.items()):
        if v:
            a = [abs(x) for x in v]
            summary.append(f"{k}: {len(v)} rows, median |difference| {100 * statistics.median(a):.1f}%, "
                           f"worst {100 * max(a):.1f}%, median signed {100 * statistics.median(v):+.1f}%")
    print(("\n" if not markdown else "\n") + "\n".join(summary))
    return 1 if check and failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
