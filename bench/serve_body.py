#!/usr/bin/env python3
"""Writes a KServe v2 infer request body for `ember serve` benchmarks and tests.

usage: serve_body.py --rows N --features F [--binary] [--seed S] [--input NAME] OUT

Rows of F uniform values in [0, 1) (a classifier's input in ToTensor's scale),
FP32. --binary: the binary tensor data extension (JSON header, then the raw
little-endian floats; the output 'logits' asked as binary too); OUT.hlen then
holds the header length for the Inference-Header-Content-Length header. Without
it the body is plain JSON. Standard library only (runs without numpy).
"""
import argparse
import json
import random
import struct

ap = argparse.ArgumentParser()
ap.add_argument("--rows", type=int, required=True)
ap.add_argument("--features", type=int, default=784)
ap.add_argument("--binary", action="store_true")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--input", default="input")
ap.add_argument("out")
a = ap.parse_args()
rng = random.Random(a.seed)
vals = [rng.random() for _ in range(a.rows * a.features)]
shape = [a.rows, a.features]
if a.binary:
    hdr = json.dumps({"inputs": [{"name": a.input, "shape": shape, "datatype": "FP32",
                                  "parameters": {"binary_data_size": 4 * len(vals)}}],
                      "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]},
                     separators=(",", ":")).encode()
    with open(a.out, "wb") as f:
        f.write(hdr + struct.pack("<%df" % len(vals), *vals))
    with open(a.out + ".hlen", "w") as f:
        f.write(str(len(hdr)))
else:
    body = {"inputs": [{"name": a.input, "shape": shape, "datatype": "FP32", "data": [float("%.6g" % v) for v in vals]}],
            "outputs": [{"name": "logits"}]}
    with open(a.out, "w") as f:
        json.dump(body, f, separators=(",", ":"))
