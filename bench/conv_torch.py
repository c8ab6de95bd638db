"""PyTorch side of bench/bench_conv_cpu.c: the same conv shapes on the CPU,
forward (no grad) and forward + backward (x and w require grad; backward with
a random dy), ms per call, best of RUNS after WARMUP, with
torch.set_num_threads(threads).

    python3 bench/conv_torch.py THREADS

Prints one line per shape: name fwd_ms fwdbwd_ms (the C bench reads them)."""
import sys
import time

import torch
import torch.nn.functional as F

# name, (N, C, H, W), (O, C/g, KH, KW), stride, pad, groups -- as bench_conv_cpu.c
SHAPES = [
    ("conv1", (64, 1, 28, 28), (32, 1, 3, 3), 1, 0, 1),
    ("conv2", (64, 32, 26, 26), (64, 32, 3, 3), 1, 0, 1),
    ("c64x64", (32, 64, 32, 32), (64, 64, 3, 3), 1, 1, 1),
    ("dw64", (32, 64, 32, 32), (64, 1, 3, 3), 1, 1, 64),
    ("s2_64x128", (32, 64, 32, 32), (128, 64, 3, 3), 2, 1, 1),
    ("pw1x1", (32, 64, 32, 32), (128, 64, 1, 1), 1, 0, 1),
]
RUNS, WARMUP = 7, 2


def best(f):
    ts = []
    for r in range(WARMUP + RUNS):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return min(ts[WARMUP:]) * 1e3


def main():
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    torch.manual_seed(0)
    for name, xs, ws, s, p, g in SHAPES:
        x = torch.rand(xs) * 2 - 1
        w = torch.rand(ws) * 2 - 1
        with torch.no_grad():
            y = F.conv2d(x, w, None, s, p, 1, g)
        dy = torch.rand(y.shape) * 2 - 1

        def fwd():
            with torch.no_grad():
                F.conv2d(x, w, None, s, p, 1, g)

        xg = x.clone().requires_grad_()
        wg = w.clone().requires_grad_()

        def fwdbwd():
            F.conv2d(xg, wg, None, s, p, 1, g).backward(dy)

        print(name, "%.3f" % best(fwd), "%.3f" % best(fwdbwd), flush=True)


if __name__ == "__main__":
    main()
