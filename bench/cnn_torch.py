"""PyTorch side of bench/bench_cnn.c: the pytorch/examples MNIST CNN (the net
of ../shared/anchors/torch_graphs.py), Adam, cross-entropy, random data.

    python3 bench/cnn_torch.py [--device cpu|cuda] [--steps N] [--threads N] [--bf16] [batch ...]

--bf16: the forward and loss under torch.autocast(dtype=torch.bfloat16)
(f32 weights), as bench_cnn --bf16.

On cuda it prints eager and whole-step CUDA-graph figures (capturable Adam,
cudnn.benchmark), each the median of 3 runs with the runs listed; on cpu,
eager only with torch.set_num_threads(--threads)."""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):  # pytorch/examples mnist
    def __init__(s):
        super().__init__()
        s.conv1 = nn.Conv2d(1, 32, 3, 1)
        s.conv2 = nn.Conv2d(32, 64, 3, 1)
        s.d1 = nn.Dropout(0.25)
        s.d2 = nn.Dropout(0.5)
        s.fc1 = nn.Linear(9216, 128)
        s.fc2 = nn.Linear(128, 10)

    def forward(s, x):
        x = F.relu(s.conv1(x))
        x = F.relu(s.conv2(x))
        x = F.max_pool2d(x, 2)
        x = s.d1(x)
        x = torch.flatten(x, 1)
        x = F.relu(s.fc1(x))
        x = s.d2(x)
        return s.fc2(x)


def bench(dev, B, mode, steps, warmup, bf16=False):
    torch.manual_seed(0)
    m = Net().to(dev)
    x = torch.randn((B, 1, 28, 28), device=dev)
    y = torch.randint(0, 10, (B,), device=dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, capturable=(mode == "graph"))

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()

    run = step
    if mode == "graph":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(5):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        run = g.replay
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for _ in range(warmup):
        run()
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        run()
    sync()
    return (time.perf_counter() - t) / steps


ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cpu")
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--warmup", type=int, default=5)
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--bf16", action="store_true")
ap.add_argument("batches", type=int, nargs="*", default=[64, 512])
a = ap.parse_args()
if a.threads:
    torch.set_num_threads(a.threads)
if a.device == "cuda":
    torch.backends.cudnn.benchmark = True
    print("torch", torch.__version__, torch.cuda.get_device_name(0))
else:
    print("torch", torch.__version__, "cpu,", torch.get_num_threads(), "threads")
for B in a.batches:
    for mode in (("eager", "graph") if a.device == "cuda" else ("eager",)):
        r = [bench(a.device, B, mode, a.steps, a.warmup, a.bf16) for _ in range(a.runs)]
        dt = sorted(r)[len(r) // 2]
        tag = " bf16 autocast" if a.bf16 else ""
        print(f"MNIST CNN training{tag}, batch {B}: PyTorch {mode} {B / dt:.0f} samples/s ({dt * 1e6:.1f} us/step)"
              f" (runs us: {', '.join(f'{v * 1e6:.0f}' for v in r)})", flush=True)
