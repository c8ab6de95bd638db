#!/usr/bin/python3
"""PyTorch reference for `ember train`'s default run (CPU training benchmark).

Trains the same MLP as `ember train` (Flatten, Linear 784-256, ReLU,
Linear 256-128, ReLU, Linear 128-10; PyTorch's default Linear init, as
Ember's), with Adam lr 1e-3, CosineAnnealingLR(T_max = epochs) stepped per
epoch (ember train's default --scheduler cosine), batch 64, shuffled each
epoch, mean cross-entropy, on Fashion-MNIST read from the IDX .gz files with
gzip + numpy and normalized (x/255 - 0.2860) / 0.3530. After each training
epoch it evaluates the 10,000 test images in batches of 1000 (as ember train's
validation pass), and prints:

  epoch E/N  train_loss ..  train_acc ..  val_loss ..  val_acc ..  S samples/s  train T1s  epoch T2s

where samples/s and train time cover the training pass only and the epoch
time covers training + evaluation (the same split as Ember's metrics).

Usage: /usr/bin/python3 bench/train_mlp_torch.py [--epochs 2] [--threads 2]
       [--batch-size 64] [--data /usr/share/datasets/fashion-mnist] [--seed 0]
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    ndim = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, train):
    pre = "train" if train else "t10k"
    x = read_idx(os.path.join(data_dir, f"{pre}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data_dir, f"{pre}-labels-idx1-ubyte.gz"))
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - MEAN) / STD  # [N, 28, 28]
    return x, torch.from_numpy(y.astype(np.int64))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr, ytr = load(a.data, True)
    xte, yte = load(a.data, False)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.epochs)
    n = xtr.shape[0]
    print(f"torch {torch.__version__}: MLP 784-256-128-10 ({sum(p.numel() for p in model.parameters())} parameters), "
          f"adam lr {a.lr}, batch {a.batch_size}, {a.epochs} epochs, {torch.get_num_threads()} threads "
          f"(interop {torch.get_num_interop_threads()}), {n} train / {xte.shape[0]} test samples", flush=True)
    train_times, epoch_times = [], []
    for epoch in range(1, a.epochs + 1):
        t0 = time.perf_counter()
        model.train()
        perm = torch.randperm(n)
        loss_sum = torch.zeros((), dtype=torch.float64)
        correct = torch.zeros((), dtype=torch.int64)
        for i in range(0, n, a.batch_size):
            idx = perm[i:i + a.batch_size]
            xb, yb = xtr[idx], ytr[idx]
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                loss_sum += loss.detach() * yb.shape[0]
                correct += (logits.argmax(1) == yb).sum()
        t_train = time.perf_counter() - t0
        model.eval()
        vloss = torch.zeros((), dtype=torch.float64)
        vcorrect = 0
        with torch.no_grad():
            for i in range(0, xte.shape[0], 1000):
                logits = model(xte[i:i + 1000])
                vloss += F.cross_entropy(logits, yte[i:i + 1000], reduction="sum")
                vcorrect += int((logits.argmax(1) == yte[i:i + 1000]).sum())
        sched.step()
        t_epoch = time.perf_counter() - t0
        train_times.append(t_train)
        epoch_times.append(t_epoch)
        print(f"epoch {epoch}/{a.epochs}  train_loss {float(loss_sum) / n:.4f}  train_acc {int(correct) / n:.4f}  "
              f"val_loss {float(vloss) / xte.shape[0]:.4f}  val_acc {vcorrect / xte.shape[0]:.4f}  "
              f"{n / t_train:.0f} samples/s  train {t_train:.2f}s  epoch {t_epoch:.2f}s", flush=True)
    print(f"mean train time {sum(train_times) / len(train_times):.3f}s; mean epoch time "
          f"{sum(epoch_times) / len(epoch_times):.3f}s", flush=True)


if __name__ == "__main__":
    main()
