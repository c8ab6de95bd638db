"""PyTorch DDP side of the data-parallel scaling benchmark (scripts/gpu-scaling.sh).

The same two workloads as Ember's side, one process per GPU, NCCL backend:

  --model fmnist  the `ember train` default: MLP 784-256-128-10 on the real
                  Fashion-MNIST training set (gzipped IDX files in --data),
                  Adam lr 1e-3, cross-entropy, batch --batch per GPU (64),
                  normalised with mean 0.2860 / std 0.3530, each epoch shuffled
                  and split across ranks like Ember's loader (shard_even: rank r
                  takes samples r, r+W, ... of the permutation cut to a multiple
                  of W). Batches are gathered on the host and copied to the GPU
                  (pinned, non_blocking), as Ember's loader does. --epochs
                  epochs (3); throughput = mean over epochs 2.. of (samples of
                  all ranks / slowest rank's train time); no evaluation pass.
  --model wide    an MLP --in-(--hidden)-10 on random data made on the GPU
                  (a different batch per rank), --warmup untimed steps then
                  --steps timed steps; throughput = global batch x steps /
                  slowest rank's time.

Launch (one process per GPU):
  python3 -m torch.distributed.run --standalone --nproc_per_node G bench/ddp_torch.py --model wide ...
or under mpirun (OMPI_COMM_WORLD_* variables; MASTER_ADDR/MASTER_PORT default
127.0.0.1:29500). NCCL_NVLS_ENABLE=0 should be set (see ENVIRONMENT.md).

Rank 0 prints a human line and
  RESULT label=... ranks=G batch=B steps=S params=P samples_per_s=X ms_per_step=Y
"""
import argparse
import gzip
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def env_int(*names, default=0):
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            return int(v)
    return default


def mlp(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def read_idx(path, offset):
    """The bytes of a gzipped IDX file after its header, as a uint8 tensor (no numpy needed)."""
    with gzip.open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8, offset=offset)


def slowest(t, dev):
    x = torch.tensor([t], dtype=torch.float64, device=dev)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return float(x.item())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["fmnist", "wide"], default="wide")
    ap.add_argument("--label", default=None)
    ap.add_argument("--batch", type=int, default=None, help="per GPU (fmnist 64, wide 512)")
    ap.add_argument("--hidden", default=None, help="fmnist 256,128; wide 4096,4096,4096")
    ap.add_argument("--in-features", type=int, default=784)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU (to test this script without a GPU)")
    a = ap.parse_args()
    fm = a.model == "fmnist"
    batch = a.batch or (64 if fm else 512)
    hidden = [int(h) for h in (a.hidden or ("256,128" if fm else "4096,4096,4096")).split(",")]
    label = a.label or a.model

    rank = env_int("RANK", "OMPI_COMM_WORLD_RANK")
    world = env_int("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", default=1)
    local = env_int("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if a.cpu:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    else:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    sync = (lambda: None) if a.cpu else torch.cuda.synchronize
    pin = (lambda t: t) if a.cpu else (lambda t: t.pin_memory())
    torch.backends.cuda.matmul.allow_tf32 = False  # Ember's default is plain FP32 too
    torch.backends.cudnn.allow_tf32 = False

    torch.manual_seed(0)
    model = mlp([a.in_features] + hidden + [10]).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, device_ids=None if a.cpu else [local])
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    lossf = nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = lossf(ddp(x), y)
        loss.backward()
        opt.step()
        return loss

    spec = "-".join(str(s) for s in [a.in_features] + hidden + [10])
    if fm:
        xs = read_idx(os.path.join(a.data, "train-images-idx3-ubyte.gz"), 16).reshape(-1, 784)
        ys = read_idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz"), 8).long()
        X = ((xs.float() / 255.0 - 0.2860) / 0.3530).contiguous()
        Y = ys.clone()
        n = X.shape[0]
        limit = (n // world) * world
        rates, times = [], []
        for epoch in range(1, a.epochs + 1):
            g = torch.Generator().manual_seed(epoch)
            perm = torch.randperm(n, generator=g)[:limit][rank::world]
            m = perm.numel()
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            for b0 in range(0, m, batch):
                idx = perm[b0:b0 + batch]
                x = pin(X.index_select(0, idx)).to(dev, non_blocking=True)
                y = pin(Y.index_select(0, idx)).to(dev, non_blocking=True)
                step(x, y)
            sync()
            t = slowest(time.perf_counter() - t0, dev)
            rates.append(limit / t)
            times.append(t / ((m + batch - 1) // batch))
            if rank == 0:
                print(f"ddp_torch: epoch {epoch}: {limit / t:.0f} samples/s ({t:.2f} s)", flush=True)
        use = rates[1:] or rates
        sps = sum(use) / len(use)
        ms = sum(times[1:] or times) / len(times[1:] or times) * 1e3
        steps = (m + batch - 1) // batch
    else:
        g = torch.Generator(device=dev).manual_seed(1000 + rank)
        x = torch.randn(batch, a.in_features, device=dev, generator=g)
        y = torch.randint(0, 10, (batch,), device=dev, generator=g)
        for _ in range(a.warmup):
            step(x, y)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step(x, y)
        sync()
        t = slowest(time.perf_counter() - t0, dev)
        sps = batch * world * a.steps / t
        ms = t / a.steps * 1e3
        steps = a.steps
    if rank == 0:
        print(f"ddp_torch: {label} MLP {spec} ({nparams} parameters), {world} GPU(s), batch {batch} per GPU: "
              f"{sps:.0f} samples/s, {ms:.2f} ms/step (torch {torch.__version__}, "
              f"{'CPU' if a.cpu else torch.cuda.get_device_name(dev)})")
        print(f"RESULT label={label} ranks={world} batch={batch} steps={steps} params={nparams} "
              f"samples_per_s={sps:.1f} ms_per_step={ms:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
