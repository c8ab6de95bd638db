#!/usr/bin/env python3
"""Exports a PyTorch MLP and CNN to ONNX with Debian's python3-torch (issue #19):

    onnx_torch_export.py OUT

writes OUT/{mlp,cnn}.onnx (opset 17, dynamic batch), inputs OUT/x1.npy and
OUT/x64.npy ([N, 1, 28, 28] float32, batch 1 and 64), and PyTorch's outputs
OUT/torch_{mlp,cnn}_{1,64}.npy. The models are Ember's Fashion-MNIST MLP
(784-256-10) and a small CNN (Conv-BatchNorm-ReLU-MaxPool twice, Linear),
in eval mode, with seeded random weights and BatchNorm statistics.
"""
import os
import sys

import numpy as np
import torch


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 10))
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1, bias=False), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 10))
    for m in cnn.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    xs = {1: torch.rand(1, 1, 28, 28), 64: torch.rand(64, 1, 28, 28)}
    for b, x in xs.items():
        np.save(os.path.join(out, f"x{b}.npy"), x.numpy())
    for name, model in (("mlp", mlp), ("cnn", cnn)):
        model.eval()
        torch.onnx.export(model, xs[1], os.path.join(out, f"{name}.onnx"), input_names=["x"],
                          output_names=["logits"], dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}},
                          opset_version=17)
        with torch.no_grad():
            for b, x in xs.items():
                np.save(os.path.join(out, f"torch_{name}_{b}.npy"), model(x).numpy())
    print(f"torch {torch.__version__}: exported mlp.onnx and cnn.onnx to {out}")


if __name__ == "__main__":
    main()
