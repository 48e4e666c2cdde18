#!/usr/bin/env python3
"""PyTorch 1.13's own reader of a snapshot's segment list (torch.cuda._memory_viz.stats, Debian's
python3-torch) on a membill --snapshot: prints its figures, exact, as JSON, to make the golden
tests/golden/snapshot/stats_113.json that CI (no torch) checks membill snapshot against.

    /usr/bin/python3 tests/reference/snapshot_stats_113.py SNAPSHOT.pickle > tests/golden/snapshot/stats_113.json

1.13's torch.cuda.memory._snapshot() returned the segment list alone; later versions a dict with
"segments": stats reads the list, as 1.13's _memory_viz does."""
import json
import pickle
import sys

import torch
import torch.cuda._memory_viz as memory_viz


class DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a class in a snapshot: {module}.{name}")


def main(path):
    with open(path, "rb") as f:
        snap = DataOnly(f).load()
    stats = memory_viz.stats(snap["segments"])  # asserts each segment's blocks add up to it
    out = {k: (v.value if isinstance(v, memory_viz.Bytes) else v) for k, v in stats.items()}
    out["torch"] = torch.__version__
    print(json.dumps(out, indent=2, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])
