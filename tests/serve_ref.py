#!/usr/bin/env python3
"""Helpers of tests/e2e_serve.sh (standard library only, no numpy): builds
infer request bodies from Fashion-MNIST test images, computes a reference
forward of an MLP checkpoint straight from its SafeTensors file, and checks
the server's JSON and binary-extension responses against it.

  serve_ref.py mkreq OUT.json K,K,... [mlp|cnn]       JSON request of test images K
  serve_ref.py mkbin OUT.bin K,K,...                  binary request; prints its JSON header length
  serve_ref.py check RESP.json CKPT K,K,... [PREDICT.txt]
        shapes, probabilities sum to 1, logits = the reference forward (1e-4 relative),
        and the argmax / top probability equal `ember predict`'s (when given);
        $SERVE_REF_NORM "none" or "MEAN,STD" replaces the checkpoint's normalisation
  serve_ref.py checkbin RESP.bin HEADERS.txt JSON_RESP.json
        the binary logits equal the JSON path's, bit for bit up to printing
  serve_ref.py probs RESP.json N                      shapes [N, 10], each row sums to 1
"""
import gzip
import json
import math
import os
import struct
import sys

CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def die(msg):
    print("serve_ref.py: " + msg, file=sys.stderr)
    sys.exit(1)


def images(ks):
    d = os.environ.get("EMBER_DATA_DIR") or "/usr/share/datasets/fashion-mnist"
    p = os.path.join(d, "t10k-images-idx3-ubyte")
    raw = open(p, "rb").read() if os.path.exists(p) else gzip.open(p + ".gz", "rb").read()
    magic, n, rows, cols = struct.unpack(">IIII", raw[:16])
    if magic != 2051 or rows * cols != 784:
        die("%s: not an IDX image file" % p)
    out = []
    for k in ks:
        if k >= n:
            die("image %d of %d" % (k, n))
        off = 16 + k * 784
        out.append([b / 255.0 for b in raw[off:off + 784]])
    return out


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def load_safetensors(path):
    b = open(path, "rb").read()
    (n,) = struct.unpack("<Q", b[:8])
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    base = 8 + n
    t = {}
    for k, v in h.items():
        if v["dtype"] != "F32":
            continue
        s, e = v["data_offsets"]
        cnt = (e - s) // 4
        t[k] = (v["shape"], list(struct.unpack("<%df" % cnt, b[base + s:base + e])))
    return meta, t


def mlp_forward(ckpt, xs):
    """The MLP's logits: (x - mean) / std, then Linear layers model.N in
    order with ReLU between them (the spec mlp:784-H...-10)."""
    meta, t = load_safetensors(ckpt)
    if not meta.get("ember.model", "").startswith("mlp:"):
        die("%s: not an MLP (%s)" % (ckpt, meta.get("ember.model")))
    mean = float(meta["ember.norm_mean"])
    std = float(meta["ember.norm_std"])
    norm = os.environ.get("SERVE_REF_NORM")  # "none" or "MEAN,STD": config.json's "normalize"
    if norm == "none":
        mean, std = 0.0, 1.0
    elif norm:
        mean, std = (float(v) for v in norm.split(","))
    idx = sorted({int(k.split(".")[1]) for k in t if k.startswith("model.") and k.endswith(".weight")})
    out = []
    for x in xs:
        h = [(f32(v) - mean) / std for v in x]
        for li, i in enumerate(idx):
            (o, n), w = t["model.%d.weight" % i]
            _, bias = t["model.%d.bias" % i]
            if n != len(h):
                die("layer %d takes %d inputs, got %d" % (i, n, len(h)))
            y = [bias[r] + math.fsum(w[r * n + c] * h[c] for c in range(n)) for r in range(o)]
            if li != len(idx) - 1:
                y = [max(0.0, v) for v in y]
            h = y
        out.append(h)
    return out


def outputs(resp):
    return {o["name"]: o for o in resp["outputs"]}


def check_probs(o, n):
    p = o["probabilities"]
    if o["logits"]["shape"] != [n, 10] or p["shape"] != [n, 10] or p["datatype"] != "FP32":
        die("bad output shapes %s %s" % (o["logits"]["shape"], p["shape"]))
    for r in range(n):
        s = sum(p["data"][r * 10:(r + 1) * 10])
        if abs(s - 1.0) > 1e-5:
            die("row %d: probabilities sum to %.8f" % (r, s))


def main():
    cmd = sys.argv[1]
    if cmd == "mkreq":
        ks = [int(k) for k in sys.argv[3].split(",")]
        layout = sys.argv[4] if len(sys.argv) > 4 else "mlp"
        xs = images(ks)
        shape = [len(ks), 784] if layout == "mlp" else [len(ks), 1, 28, 28]
        req = {"inputs": [{"name": "input", "datatype": "FP32", "shape": shape,
                           "data": [v for x in xs for v in x]}]}
        json.dump(req, open(sys.argv[2], "w"))
    elif cmd == "mkbin":
        ks = [int(k) for k in sys.argv[3].split(",")]
        xs = images(ks)
        raw = struct.pack("<%df" % (784 * len(ks)), *[v for x in xs for v in x])
        hdr = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [len(ks), 784],
                                      "parameters": {"binary_data_size": len(raw)}}],
                          "outputs": [{"name": "logits", "parameters": {"binary_data": True}},
                                      {"name": "probabilities", "parameters": {"binary_data": False}}]}).encode()
        open(sys.argv[2], "wb").write(hdr + raw)
        print(len(hdr))
    elif cmd == "check":
        resp = json.load(open(sys.argv[2]))
        ks = [int(k) for k in sys.argv[4].split(",")]
        o = outputs(resp)
        check_probs(o, len(ks))
        got = o["logits"]["data"]
        ref = mlp_forward(sys.argv[3], images(ks))
        worst = 0.0
        for r, row in enumerate(ref):
            scale = max(abs(v) for v in row)
            for c, v in enumerate(row):
                worst = max(worst, abs(got[r * 10 + c] - v) / scale)
        if worst > 1e-4:
            die("logits differ from the reference forward: max relative error %.3g" % worst)
        line = "max relative error %.2e" % worst
        if len(sys.argv) > 5:
            pred = [l for l in open(sys.argv[5]).read().splitlines() if l.startswith("image ")]
            if len(pred) != len(ks):
                die("%d lines from ember predict, expected %d" % (len(pred), len(ks)))
            p = o["probabilities"]["data"]
            for r, l in enumerate(pred):
                tail = l.split("):", 1)[1].strip()
                name, prob = tail.rsplit(" ", 1)
                row = p[r * 10:(r + 1) * 10]
                am = max(range(10), key=lambda c: row[c])
                if CLASSES[am] != name or abs(row[am] - float(prob)) > 0.0006:
                    die("image %d: server %s %.4f, ember predict %s %s" % (ks[r], CLASSES[am], row[am], name, prob))
            line += "; argmax = ember predict's for images %s" % sys.argv[4]
        print(line)
    elif cmd == "checkbin":
        body = open(sys.argv[2], "rb").read()
        hl = None
        for l in open(sys.argv[3], "r", errors="replace").read().splitlines():
            if l.lower().startswith("inference-header-content-length:"):
                hl = int(l.split(":", 1)[1].strip())
        if hl is None:
            die("no Inference-Header-Content-Length in the response")
        hdr = json.loads(body[:hl])
        o = outputs(hdr)
        lg = o["logits"]
        size = lg.get("parameters", {}).get("binary_data_size")
        if "data" in lg or size is None:
            die("logits not sent as binary: %s" % lg)
        n = lg["shape"][0] * lg["shape"][1]
        if size != 4 * n or len(body) != hl + size:
            die("binary_data_size %s for %d values, body %d bytes after a %d-byte header" % (size, n, len(body), hl))
        binl = struct.unpack("<%df" % n, body[hl:hl + size])
        ref = outputs(json.load(open(sys.argv[4])))["logits"]["data"]
        if len(ref) != n or any(abs(a - b) > 1e-6 * max(1.0, abs(b)) for a, b in zip(binl, ref)):
            die("binary logits differ from the JSON ones")
        if "data" not in o["probabilities"]:
            die("probabilities (binary_data false) not in the JSON header")
        print("%d binary logits = the JSON ones; header %d bytes" % (n, hl))
    elif cmd == "probs":
        check_probs(outputs(json.load(open(sys.argv[2]))), int(sys.argv[3]))
    else:
        die("unknown command " + cmd)


if __name__ == "__main__":
    main()
