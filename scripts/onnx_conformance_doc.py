#!/usr/bin/env python3
"""Turns onnx_node_runner's results file (BUILD/onnx-node-results.txt, one
"PASS name" / "FAIL name: reason" / "UNSUPPORTED name: reason" per line) into
docs/onnx-conformance.md: the totals, the reasons grouped and counted, and
every test that does not pass with its reason.

Usage: onnx_conformance_doc.py RESULTS OUT.md [--header TEXT]
"""
import collections
import re
import sys


def reason_class(status, msg):
    m = re.search(r"operator (\S+) is not supported", msg)
    if m:
        return f"operator {m.group(1)} not implemented"
    m = re.search(r"Ember implements (\S+) from opset (\d+)", msg)
    if m:
        return f"{m.group(1)}: older opset not implemented"
    m = re.search(r"domain '([^']+)'", msg)
    if m:
        return f"domain {m.group(1)}"
    m = re.search(r"element type (\S+)", msg)
    if m:
        return f"element type {m.group(1).rstrip(',')}"
    if "non-tensor" in msg or "not a tensor" in msg:
        return "sequence / optional / map values"
    m = re.search(r"\((\w+), opset \d+\): (.*)", msg)
    if m:
        detail = re.sub(r"[0-9]+", "N", m.group(2))[:90]
        return f"{m.group(1)}: {detail}"
    return re.sub(r"/\S+", "PATH", msg)[:100]


def main():
    res, out = sys.argv[1], sys.argv[2]
    header = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--header" else ""
    rows = []
    for line in open(res):
        line = line.rstrip("\n")
        if not line:
            continue
        status, rest = line.split(" ", 1)
        name, _, msg = rest.partition(": ")
        rows.append((status, name, msg))
    total = len(rows)
    count = collections.Counter(s for s, _, _ in rows)
    reasons = collections.Counter()
    for s, _, msg in rows:
        if s != "PASS":
            reasons[(s, reason_class(s, msg))] += 1
    p = count["PASS"]
    with open(out, "w") as f:
        f.write("# ONNX conformance: the backend node tests\n\n")
        if header:
            f.write(header + "\n\n")
        f.write(f"**{p} of {total} pass ({100.0 * p / total:.1f} %)**; "
                f"{count['FAIL']} fail, {count['UNSUPPORTED']} are unsupported.\n\n")
        f.write("PASS: every output of every data set matches (onnx's rtol/atol for the case, NaN = NaN, "
                "integers exactly). UNSUPPORTED: an operator, attribute value, element type or value kind "
                "Ember does not implement, refused with an error naming it. FAIL: anything else.\n\n")
        f.write("## Reasons, most frequent first\n\n| tests | status | reason |\n| ---: | --- | --- |\n")
        for (s, r), n in reasons.most_common():
            f.write(f"| {n} | {s} | {r.replace('|', '/')} |\n")
        f.write("\n## Every test that does not pass\n\n| test | status | reason |\n| --- | --- | --- |\n")
        for s, name, msg in rows:
            if s != "PASS":
                msg = re.sub(r"/\S*/(test_[^/\s]+)/", r"\1/", msg).replace("|", "/")
                f.write(f"| {name} | {s} | {msg[:300]} |\n")
    print(f"{out}: {p} of {total} pass")


if __name__ == "__main__":
    main()
