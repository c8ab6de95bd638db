#!/usr/bin/env python3
"""Times torch.nn.functional.scaled_dot_product_attention forward + backward at
the shapes of bench/attention_harness.cu's timing table (causal; median of 20
after 3 warm-up, CUDA events, ms), and with --ember [NAME=]FILE (the
harness's --times output; repeatable, one per build variant) prints them side
by side: the first file's fwd / bwd / total, then every other variant's fwd / bwd."""
import argparse
import torch
import torch.nn.functional as F

SHAPES = [(8, 12, 256, 64, "f32", 0.0), (8, 12, 1024, 64, "f32", 0.0), (8, 12, 4096, 64, "f32", 0.0),
          (8, 12, 256, 64, "bf16", 0.0), (8, 12, 1024, 64, "bf16", 0.0), (8, 12, 4096, 64, "bf16", 0.0),
          (64, 6, 256, 64, "f32", 0.2), (64, 6, 256, 64, "bf16", 0.2)]


def key(B, H, T, D, dt, p):
    return "B%d_H%d_T%d_D%d_%s_p%.1f" % (B, H, T, D, dt, p)


def bench(B, H, T, D, dt, p):
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dt]
    q, k, v = [torch.randn(B, H, T, D, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3)]
    do = torch.randn(B, H, T, D, device="cuda", dtype=dtype)
    fw, bw, tot = [], [], []
    for it in range(23):
        q.grad = k.grad = v.grad = None
        e0, e1, e2 = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        e0.record()
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        e1.record()
        o.backward(do)
        e2.record()
        torch.cuda.synchronize()
        if it >= 3:
            a, b = e0.elapsed_time(e1), e1.elapsed_time(e2)
            fw.append(a); bw.append(b); tot.append(a + b)
    med = lambda x: sorted(x)[len(x) // 2]
    return med(fw), med(bw), med(tot)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ember", action="append", default=[], help="[NAME=]FILE, the harness's --times file")
    args = ap.parse_args()
    print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
    embers = []  # (name, {key: (fwd, bwd, tot)})
    for spec in args.ember:
        name, _, path = spec.rpartition("=")
        d = {}
        try:
            for line in open(path):
                f = line.split()
                if len(f) == 4:
                    d[f[0]] = tuple(float(x) for x in f[1:])
        except OSError as e:
            print("no ember times:", e)
        embers.append((name or path, d))
    first = embers[0][1] if embers else {}
    print("\nfwd / bwd / fwd+bwd in ms, causal, median of 20 (ember = devices/cuda/attention.cu, torch = F.scaled_dot_product_attention)")
    extra = "".join(" %15s" % (n + " fwd/bwd")[:15] for n, _ in embers[1:])
    print("%-26s | %8s %8s %8s | %8s %8s %8s | %7s |%s" % ("shape", "em fwd", "em bwd", "em tot", "th fwd", "th bwd", "th tot", "em/th", extra))
    for s in SHAPES:
        t = bench(*s)
        e = first.get(key(*s))
        es = ("%8.3f %8.3f %8.3f" % e) if e else "%8s %8s %8s" % ("-", "-", "-")
        ratio = ("%7.2f" % (e[2] / t[2])) if e else "-"
        ex = "".join(" %7.3f/%7.3f" % d[key(*s)][:2] if key(*s) in d else " %15s" % "-" for _, d in embers[1:])
        print("%-26s | %s | %8.3f %8.3f %8.3f | %7s |%s" % (key(*s), es, t[0], t[1], t[2], ratio, ex), flush=True)
    for name, d in embers:  # ember-only shapes
        for k, v in d.items():
            if k not in [key(*s) for s in SHAPES]:
                print("ember %-4s %-26s fwd %8.3f bwd %8.3f tot %8.3f" % (name, k, *v))


if __name__ == "__main__":
    main()
