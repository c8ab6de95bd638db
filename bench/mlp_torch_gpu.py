"""PyTorch eager side of bench_cuda's MLP benchmark: MLP 784-256-10, Adam,
cross-entropy, random data on cuda:0; prints samples/s at batch 64 and 512,
in f32 and (rows marked bf16) with the forward and loss under
torch.autocast("cuda", dtype=torch.bfloat16): f32 master weights, as
Ember's em_autocast_begin(EM_BF16). `python3 mlp_torch_gpu.py bf16` runs
the bf16 rows only, `f32` the f32 rows only. `graph` runs the f32 step
eagerly and as one whole-step CUDA graph (forward, backward and
Adam(capturable=True) captured with torch.cuda.graph after 5 warm-up steps on
a side stream, replayed per step): the peer of Ember's captured step
(bench_fusion), on fixed random data like it."""
import contextlib
import sys
import time
import torch

def run(batch, steps, bf16=False):
    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    m = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    x = torch.randn(batch, 784, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    lossf = torch.nn.CrossEntropyLoss()
    for s in range(steps + 20):
        if s == 20:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            loss = lossf(m(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    t = time.perf_counter() - t0
    tag = " bf16 autocast" if bf16 else ""
    print(f"MLP 784-256-10 training{tag}, batch {batch}: PyTorch {batch * steps / t:.0f} samples/s ({t / steps * 1e6:.1f} us/step)")

def run_graph(batch, steps, graph):
    """us/step of the f32 step, eager (graph False; zero_grad(set_to_none=False)
    as the graph needs) or replayed as one CUDA graph."""
    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    m = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, capturable=graph)
    x = torch.randn(batch, 784, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    lossf = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=False)
        lossf(m(x), y).backward()
        opt.step()

    run_step = step
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(5):
                step()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        run_step = g.replay
    for _ in range(20):
        run_step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        run_step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e6


print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
which = sys.argv[1] if len(sys.argv) > 1 else "all"
if which == "graph":
    for batch in (64, 512):
        for graph in (False, True):
            us = run_graph(batch, 300, graph)
            mode = "CUDA graph" if graph else "eager"
            print(f"MLP 784-256-10 training, batch {batch}: PyTorch {mode} {us:.1f} us/step ({batch / us * 1e6:.0f} samples/s)")
    sys.exit(0)
for bf16 in (False, True):
    if which == ("bf16" if not bf16 else "f32"):
        continue
    run(64, 500, bf16)
    run(512, 300, bf16)
