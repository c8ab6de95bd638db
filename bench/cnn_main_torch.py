"""PyTorch side of the CPU comparison for `ember train --model cnn`: the
same network (cnn:1x28x28-32x2-64x2-fc128-10:dropout=0.25 as its
nn.Sequential), Adam lr 1e-3, cross-entropy, batch 64, on random
[64, 1, 28, 28] batches (no data loading or augmentation: that favours this
side), torch.set_num_threads(--threads). Prints training samples/s over
--steps steps after a warm-up, and the implied time of a 60 000-image epoch.

    /usr/bin/python3 bench/cnn_main_torch.py [--threads 2] [--steps 200] [--runs 3]"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def block(cin, cout, reps):
    layers = []
    for _ in range(reps):
        layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
        cin = cout
    return layers + [nn.MaxPool2d(2)]


def model():
    return nn.Sequential(*block(1, 32, 2), *block(32, 64, 2), nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(),
                         nn.Dropout(0.25), nn.Linear(128, 10))


ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--steps", type=int, default=200)
ap.add_argument("--warmup", type=int, default=10)
ap.add_argument("--runs", type=int, default=3)
a = ap.parse_args()
torch.set_num_threads(a.threads)
res = []
for r in range(a.runs):
    torch.manual_seed(r)
    m = model()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    x = torch.randn(64, 1, 28, 28)
    y = torch.randint(0, 10, (64,))
    for i in range(a.steps + a.warmup):
        if i == a.warmup:
            t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(x), y).backward()
        opt.step()
    res.append(64 * a.steps / (time.perf_counter() - t))
med = sorted(res)[len(res) // 2]
print(f"PyTorch {torch.__version__} CPU, {a.threads} threads: cnn:1x28x28-32x2-64x2-fc128-10 training {med:.0f} samples/s "
      f"(runs: {', '.join(f'{v:.0f}' for v in res)}), {60000 / med:.1f} s per 60 000-image epoch")
