"""PyTorch side of bench/bench_resnet.c: the CIFAR variant of ResNet-18
(3x3 stem, no max-pool, BasicBlocks 64-128-256-512, 1x1 conv + BN shortcuts),
SGD momentum 0.9, cross-entropy, synthetic 32x32x3 data, eager with
cudnn.benchmark. Prints the median samples/s of --runs runs and the runs.

    python3 bench/resnet_torch.py [--device cuda] [--steps 20] [--runs 3] [batch]"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(s, cin, cout, stride):
        super().__init__()
        s.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        s.b1 = nn.BatchNorm2d(cout)
        s.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        s.b2 = nn.BatchNorm2d(cout)
        s.sc = None
        if stride != 1 or cin != cout:
            s.sc = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False), nn.BatchNorm2d(cout))

    def forward(s, x):
        o = F.relu(s.b1(s.c1(x)))
        o = s.b2(s.c2(o))
        return F.relu(o + (s.sc(x) if s.sc is not None else x))


class ResNet18(nn.Module):
    def __init__(s):
        super().__init__()
        s.c = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        s.b = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for i, w in enumerate((64, 128, 256, 512)):
            for j in range(2):
                layers.append(Block(cin, w, 2 if i > 0 and j == 0 else 1))
                cin = w
        s.layers = nn.Sequential(*layers)
        s.fc = nn.Linear(512, 10)

    def forward(s, x):
        h = F.relu(s.b(s.c(x)))
        h = s.layers(h)
        return s.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


def bench(dev, B, steps, warmup):
    torch.manual_seed(0)
    m = ResNet18().to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(B, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (B,), device=dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for i in range(steps + warmup):
        if i == warmup:
            sync()
            t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(x), y).backward()
        opt.step()
    sync()
    return (time.perf_counter() - t) / steps


ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cuda")
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=5)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("batch", type=int, nargs="?", default=256)
a = ap.parse_args()
if a.device == "cuda":
    torch.backends.cudnn.benchmark = True
r = [bench(a.device, a.batch, a.steps, a.warmup) for _ in range(a.runs)]
dt = sorted(r)[len(r) // 2]
print(f"ResNet-18 (CIFAR, 32x32) training on {a.device}, batch {a.batch}: PyTorch eager {a.batch / dt:.0f} samples/s "
      f"({dt * 1e3:.1f} ms/step) (runs ms: {', '.join(f'{v * 1e3:.1f}' for v in r)})", flush=True)
