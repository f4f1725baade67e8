#!/usr/bin/env python3
"""Per-commit instruction counts from callgrind profiles of `examples/commit_cost`.

Usage: commit_cost.py N_SMALL N_LARGE LABEL=SMALL.out,LARGE.out ...

For each label, the difference in instructions between the run with N_LARGE commits and the
run with N_SMALL, divided by the difference in N (start-up cancels out), in total and without
the in-process fabric: the inclusive cost of `SimNet::step` (the simulated wire the example
drives) and of every `SimEndpoint` method a replica calls; and without the simulated disk too:
the inclusive cost of every `FaultFs`/`FaultHandle` method the wal calls (its in-memory files
stand for a kernel's, whose work callgrind never counts). Callgrind splits a function's cost
by the source file of its inlined lines; the parts are disjoint, so they are summed by name.
"""
import re
import subprocess
import sys

FABRIC = re.compile(r"^(fabric::sim::SimNet::step|<fabric::sim::SimEndpoint as fabric::Fabric>::.*)$")
# The simulated disk (`wal::fs::FaultFs`, the file system the example's replicas run on): its
# bookkeeping of every write (a copy of the bytes, the set of unsynced sectors) stands where a
# real file system's work happens in the kernel, which callgrind does not count at all.
DISK = re.compile(r"^(<wal::fs::FaultHandle as wal::fs::WalFile>::.*|<wal::fs::FaultFs as wal::fs::FileSystem>::.*)$")


def function(label):
    """The function of a `callgrind_annotate` entry: "file:function [object]" -> "function"."""
    label = re.sub(r" \(\d[\d,]*x\)", "", re.sub(r" \[[^\]]*\]$", "", label.strip()))
    # A function name may itself hold "::" but never a source file's ".rs:".
    return re.sub(r"^.*?\.(rs|c|S|h):", "", label)


def profile(path):
    """(total, fabric): all instructions, and the inclusive cost of every call into the
    fabric made from outside it (so a fabric method calling another is counted once)."""
    out = subprocess.run(
        ["callgrind_annotate", "--tree=calling", "--inclusive=yes", "--auto=no",
         "--threshold=100", path],
        check=True, capture_output=True, text=True,
    ).stdout
    total, fabric, disk, caller = 0, 0, 0, None
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) (?:\([^)]*\))?\s+(\*|>)?\s*(.*)", line)
        if not m:
            continue
        value, mark, name = int(m.group(1).replace(",", "")), m.group(2), function(m.group(3))
        if name == "PROGRAM TOTALS":
            total = value
        elif mark == "*":
            caller = name
        elif mark == ">" and caller is not None and FABRIC.match(name) and not FABRIC.match(caller):
            fabric += value
        elif mark == ">" and caller is not None and DISK.match(name) and not DISK.match(caller):
            disk += value
    return total, fabric, disk


def main():
    n_small, n_large = int(sys.argv[1]), int(sys.argv[2])
    span = n_large - n_small
    for arg in sys.argv[3:]:
        label, paths = arg.split("=", 1)
        small, large = paths.split(",")
        (t0, f0, d0), (t1, f1, d1) = profile(small), profile(large)
        total, fabric, disk = (t1 - t0) / span, (f1 - f0) / span, (d1 - d0) / span
        print(
            f"{label:<44} {total:>9,.0f} instructions, {total - fabric:>9,.0f} without the "
            f"in-process fabric, {total - fabric - disk:>9,.0f} without it and the simulated disk"
        )


if __name__ == "__main__":
    main()
