#!/usr/bin/env python3
"""Replays a CUDA memory snapshot's device_traces (torch.cuda.memory._dump_snapshot's format,
membill's --snapshot) to its requested and reserved peaks, with Python's standard library alone.

    replay_snapshot.py SNAPSHOT.pickle [--expect REPORT.json]

Prints {"requested_peak_bytes", "reserved_peak_bytes", ...} as JSON. With --expect, a membill
JSON report (--device cuda) of the same run: exits 1 unless its device figures are the same, and
unless the trace replayed from nothing ends where the segment list says the device ended.

It unpickles with find_class refused: a snapshot is plain data, and a pickle is code."""
import json
import pickle
import sys


class DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a class in a snapshot: {module}.{name}")


def replay(trace):
    requested = reserved = 0
    peak_req = peak_res = 0
    for e in trace:
        a = e["action"]
        if a == "alloc":
            requested += e["size"]
        elif a == "free_completed":
            requested -= e["size"]
        elif a in ("segment_alloc", "segment_map"):
            reserved += e["size"]
        elif a in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
        if requested < 0 or reserved < 0:
            raise ValueError(f"the trace goes below nothing at {e}")
        peak_req = max(peak_req, requested)
        peak_res = max(peak_res, reserved)
    return requested, reserved, peak_req, peak_res


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--expect"):
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], "rb") as f:
        snap = DataOnly(f).load()
    trace = snap["device_traces"][0] if snap["device_traces"] else []
    requested, reserved, peak_req, peak_res = replay(trace)
    seg_reserved = sum(s["total_size"] for s in snap["segments"])
    seg_requested = sum(b["requested_size"] for s in snap["segments"] for b in s["blocks"]
                        if b["state"] == "active_allocated")
    out = {"trace_entries": len(trace), "requested_peak_bytes": peak_req, "reserved_peak_bytes": peak_res,
           "requested_end_bytes": requested, "reserved_end_bytes": reserved,
           "segments_reserved_bytes": seg_reserved, "segments_requested_bytes": seg_requested}
    print(json.dumps(out, indent=2))
    bad = []
    if (requested, reserved) != (seg_requested, seg_reserved):
        bad.append("the trace replayed from nothing does not end where the segment list does")
    if len(argv) == 4:
        with open(argv[3]) as f:
            dev = json.load(f)["device"]
        for k in ("requested_peak_bytes", "reserved_peak_bytes"):
            if dev[k] != out[k]:
                bad.append(f"{k}: the trace says {out[k]}, membill's report {dev[k]}")
    for b in bad:
        print(f"replay_snapshot.py: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
