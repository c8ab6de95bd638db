"""PyTorch eager side of bench_cuda's MLP benchmark: MLP 784-256-10, Adam,
cross-entropy, random data on cuda:0; prints samples/s at batch 64 and 512."""
import time
import torch

def run(batch, steps):
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
        loss = lossf(m(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    t = time.perf_counter() - t0
    print(f"MLP 784-256-10 training, batch {batch}: PyTorch {batch * steps / t:.0f} samples/s ({t / steps * 1e6:.1f} us/step)")

print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
run(64, 500)
run(512, 300)
