#!/usr/bin/env python3
"""`ember serve` with Triton's own Python client (tritonclient[http], issue #18):
- is_server_live / is_server_ready / is_model_ready, get_server_metadata,
  get_model_metadata (names, datatypes, shapes), versions;
- infer of an MLP with binary inputs and binary outputs, with JSON inputs and
  outputs (binary_data=False), and with no outputs named (all of them, Triton's
  binary_data_output parameter): the logits equal a numpy reference forward
  computed from the checkpoint's SafeTensors file (1e-4 relative), the
  probabilities are its softmax, and the binary and JSON paths agree;
- request ids are echoed; model_version "1" answers version 1's weights;
- async_infer of 8 requests at once;
- a GPT with INT64 token ids: logits [N, vocab];
- errors raise InferenceServerException carrying the server's status and message
  (wrong shape, unknown model, out-of-range token id).
Usage: serve_tritonclient.py path/to/ember WORKDIR
"""
import json
import os
import re
import select
import subprocess
import sys
import time

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

EMBER, WORK = sys.argv[1], sys.argv[2]
ENV = dict(os.environ, STARPU_SILENT="1")
checks = 0


def ok(msg):
    global checks
    checks += 1
    print("ok: " + msg, flush=True)


def sh(*args):
    subprocess.run(args, check=True, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def load_safetensors(path):
    b = open(path, "rb").read()
    n = int.from_bytes(b[:8], "little")
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    t = {}
    for k, v in h.items():
        if v["dtype"] == "F32":
            s, e = v["data_offsets"]
            t[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype="<f4").reshape(v["shape"])
    return meta, t


def mlp_reference(path, x):
    """logits of an `ember train` MLP: (x - mean) / std, Linear layers model.N
    with ReLU between them; float64."""
    meta, t = load_safetensors(path)
    assert meta["ember.model"].startswith("mlp:"), meta["ember.model"]
    h = (x.astype(np.float64) - float(meta["ember.norm_mean"])) / float(meta["ember.norm_std"])
    idx = sorted({int(k.split(".")[1]) for k in t if k.endswith(".weight")})
    for j, i in enumerate(idx):
        h = h @ t["model.%d.weight" % i].astype(np.float64).T + t["model.%d.bias" % i]
        if j != len(idx) - 1:
            h = np.maximum(h, 0.0)
    return h


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def close(got, ref, what, tol=1e-4):
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= tol, "%s: max relative error %.3g" % (what, err)
    return err


def expect_error(fn, status, substring, what):
    try:
        fn()
    except InferenceServerException as e:
        msg = e.message() or ""
        assert str(e.status()) == str(status), "%s: status %s (%s), expected %s" % (what, e.status(), msg, status)
        assert substring in msg, "%s: message %r lacks %r" % (what, msg, substring)
        return msg
    raise AssertionError("%s: no InferenceServerException" % what)


# ---- models and the server ------------------------------------------------------------
repo = os.path.join(WORK, "repo")
for v in ("1", "2"):
    os.makedirs(os.path.join(repo, "mlp", v), exist_ok=True)
os.makedirs(os.path.join(repo, "gpt", "1"), exist_ok=True)
tiny = ["--limit", "2048", "--epochs", "1", "--hidden", "16", "--no-progress"]
sh(EMBER, "train", *tiny, "--seed", "1", "--out", os.path.join(WORK, "m1"))
sh(EMBER, "train", *tiny, "--seed", "2", "--out", os.path.join(WORK, "m2"))
corpus = os.path.join(WORK, "corpus.txt")
with open(corpus, "w") as f:
    for i in range(300):
        f.write("to be, or not to be, that is the question: line %d of a tiny corpus.\n" % i)
sh(EMBER, "train", "--model", "gpt", "--data", corpus, "--iters", "10", "--warmup", "2", "--eval-interval", "10",
   "--eval-iters", "2", "--batch-size", "4", "--block-size", "32", "--n-layer", "1", "--n-head", "2",
   "--n-embd", "32", "--out", os.path.join(WORK, "g"))
for v, d in (("1", "m1"), ("2", "m2")):
    os.replace(os.path.join(WORK, d, "checkpoint.safetensors"), os.path.join(repo, "mlp", v, "model.safetensors"))
os.replace(os.path.join(WORK, "g", "checkpoint.safetensors"), os.path.join(repo, "gpt", "1", "model.safetensors"))
with open(os.path.join(repo, "mlp", "config.json"), "w") as f:
    f.write('{"max_batch_size": 16, "version_policy": {"all": {}},'
            ' "dynamic_batching": {"max_queue_delay_microseconds": 2000}}')
CK1 = os.path.join(repo, "mlp", "1", "model.safetensors")
CK2 = os.path.join(repo, "mlp", "2", "model.safetensors")

log = open(os.path.join(WORK, "server.err"), "w+")
srv = subprocess.Popen([EMBER, "serve", "--model-repository", repo, "--port", "0"], env=ENV,
                       stdout=subprocess.DEVNULL, stderr=log)
try:
    port = None
    deadline = time.time() + 30
    while port is None and time.time() < deadline:
        assert srv.poll() is None, "the server exited: " + open(log.name).read()
        m = re.search(r"^ember serve: listening on http://127\.0\.0\.1:(\d+) ", open(log.name).read(), re.M)
        port = m and m.group(1)
        time.sleep(0.1)
    assert port, "no 'listening on' line within 30 s: " + open(log.name).read()
    url = "127.0.0.1:" + port
    client = httpclient.InferenceServerClient(url=url, concurrency=8, network_timeout=30)

    # ---- health and metadata ----------------------------------------------------------
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1") and client.is_model_ready("gpt")
    assert not client.is_model_ready("nope")
    sm = client.get_server_metadata()
    assert sm["name"] == "ember" and "binary_tensor_data" in sm["extensions"], sm
    mm = client.get_model_metadata("mlp")
    assert mm["name"] == "mlp" and sorted(mm["versions"]) == ["1", "2"], mm
    assert mm["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 784]}], mm["inputs"]
    assert [(o["name"], o["datatype"], o["shape"]) for o in mm["outputs"]] == \
        [("logits", "FP32", [-1, 10]), ("probabilities", "FP32", [-1, 10])], mm["outputs"]
    gm = client.get_model_metadata("gpt", "1")
    assert gm["inputs"][0]["datatype"] == "INT64" and gm["outputs"][0]["shape"] == [-1, 256], gm
    ok("live, ready, model ready (and not for 'nope'), server metadata, model metadata of mlp and gpt")

    # ---- infer: binary, JSON, all outputs -----------------------------------------------------
    rng = np.random.default_rng(18)
    x = rng.random((5, 784), dtype=np.float32)
    ref = mlp_reference(CK2, x)

    def infer(binary_in, binary_out, outputs=True, **kw):
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary_in)
        outs = None
        if outputs:
            outs = [httpclient.InferRequestedOutput("logits", binary_data=binary_out),
                    httpclient.InferRequestedOutput("probabilities", binary_data=binary_out)]
        return client.infer("mlp", [inp], outputs=outs, **kw)

    rb = infer(True, True, request_id="req-bin")
    lb, pb = rb.as_numpy("logits"), rb.as_numpy("probabilities")
    assert lb.shape == (5, 10) and lb.dtype == np.float32 and pb.shape == (5, 10), (lb.shape, lb.dtype)
    resp = rb.get_response()
    assert resp["model_name"] == "mlp" and resp["model_version"] == "2", resp
    assert resp.get("id") == "req-bin", "the request id is not echoed: %s" % resp
    assert all("binary_data_size" in o.get("parameters", {}) for o in resp["outputs"]), resp
    e1 = close(lb, ref, "binary logits")
    close(pb, softmax(ref), "binary probabilities")
    assert np.allclose(pb.sum(axis=1), 1.0, atol=1e-5)
    ok("infer, binary inputs and outputs: logits = reference forward (max relative error %.2e), softmax, id echoed" % e1)

    rj = infer(False, False)
    lj, pj = rj.as_numpy("logits"), rj.as_numpy("probabilities")
    assert all("data" in o for o in rj.get_response()["outputs"]), rj.get_response()
    close(lj, ref, "JSON logits")
    assert np.allclose(lj, lb, rtol=1e-6, atol=0) and np.allclose(pj, pb, rtol=1e-6, atol=0), "JSON != binary"
    rm = infer(True, False)
    assert np.allclose(rm.as_numpy("logits"), lb, rtol=1e-6, atol=0), "binary in, JSON out"
    ra = infer(False, True, outputs=False)
    assert ra.as_numpy("logits") is not None and ra.as_numpy("probabilities") is not None, ra.get_response()
    assert np.allclose(ra.as_numpy("logits"), lb, rtol=1e-6, atol=0), "all outputs"
    ok("infer with JSON (binary_data=False), mixed, and no outputs named: the same logits as binary")

    r1 = infer(True, True, model_version="1")
    assert r1.get_response()["model_version"] == "1"
    close(r1.as_numpy("logits"), mlp_reference(CK1, x), "version 1 logits")
    assert not np.allclose(r1.as_numpy("logits"), lb, rtol=1e-3), "version 1 answers version 2's logits"
    ok("model_version='1': version 1's weights")

    # ---- async, concurrent --------------------------------------------------------------------
    xs = [rng.random((1 + i % 3, 784), dtype=np.float32) for i in range(8)]
    pend = []
    for xi in xs:
        inp = httpclient.InferInput("input", list(xi.shape), "FP32")
        inp.set_data_from_numpy(xi, binary_data=True)
        pend.append(client.async_infer("mlp", [inp], outputs=[httpclient.InferRequestedOutput("logits")]))
    for xi, p in zip(xs, pend):
        close(p.get_result(timeout=30).as_numpy("logits"), mlp_reference(CK2, xi), "async logits")
    ok("async_infer of 8 requests of 1-3 rows at once: each its own reference logits")

    # ---- GPT ------------------------------------------------------------------------------------
    ids = np.array([[116, 111, 32, 98, 101], [44, 32, 111, 114, 32]], dtype=np.int64)
    ti = httpclient.InferInput("input_ids", list(ids.shape), "INT64")
    ti.set_data_from_numpy(ids, binary_data=True)
    g1 = client.infer("gpt", [ti]).as_numpy("logits")
    ti.set_data_from_numpy(ids, binary_data=False)
    g2 = client.infer("gpt", [ti], outputs=[httpclient.InferRequestedOutput("logits", binary_data=False)]).as_numpy("logits")
    assert g1.shape == (2, 256) and np.isfinite(g1).all() and np.allclose(g1, g2, rtol=1e-6, atol=0), g1.shape
    ok("gpt, INT64 token ids binary and JSON: logits [2, 256], the same")

    # ---- errors ---------------------------------------------------------------------------------
    bad = httpclient.InferInput("input", [2, 783], "FP32")
    bad.set_data_from_numpy(np.zeros((2, 783), dtype=np.float32))
    m1 = expect_error(lambda: client.infer("mlp", [bad]), 400, "does not match", "wrong shape")
    m2 = expect_error(lambda: client.get_model_metadata("nope"), 404, "nope", "unknown model")
    big = np.array([[1, 2, 300]], dtype=np.int64)
    ti = httpclient.InferInput("input_ids", [1, 3], "INT64")
    ti.set_data_from_numpy(big)
    expect_error(lambda: client.infer("gpt", [ti]), 400, "token id 300", "token id out of range")
    assert client.is_server_ready()
    ok("InferenceServerException with the server's status and message: %r; %r" % (m1, m2))
    client.close()
finally:
    if srv.poll() is None:
        srv.terminate()
    try:
        rc = srv.wait(timeout=30)
    except subprocess.TimeoutExpired:
        srv.kill()
        raise
assert rc == 0, "the server exited %s after SIGTERM" % rc
print("serve_tritonclient: all %d checks passed" % checks)
