# PyTorch side of bench/bench_gpt.c: the same GPT training step (the model of
# ../shared/anchors/gpt_char.py: pre-norm blocks, fused qkv, causal
# scaled_dot_product_attention, GELU MLP, lm_head tied to wte, GPT-2
# initialisation; AdamW fused, betas 0.9/0.99, weight decay 0.1; clip 1.0) on
# random token windows, timed after warm-up. Prints tokens/s.
# Usage: python3 gpt_torch.py [--config char|124m] [--mode eager|compile]
#                             [--precision fp32|tf32|bf16] [--steps N] [--warmup N]
#                             [--batch B] [--block T]
import argparse, math, time
import torch, torch.nn as nn, torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--config", default="char", choices=["char", "124m"])
ap.add_argument("--mode", default="eager", choices=["eager", "compile"])
ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--batch", type=int, default=0)
ap.add_argument("--block", type=int, default=0)
a = ap.parse_args()
if a.config == "char":
    V, P, L, H, C, drop, B = 256, 256, 6, 6, 384, 0.2, 64
else:
    V, P, L, H, C, drop, B = 50257, 1024, 12, 12, 768, 0.0, 16
B = a.batch or B
T = a.block or P
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
torch.manual_seed(1337)
dev = "cuda"


class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.qkv, s.proj = nn.LayerNorm(C), nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.ln2, s.fc, s.fc2, s.d = nn.LayerNorm(C), nn.Linear(C, 4 * C), nn.Linear(4 * C, C), nn.Dropout(drop)

    def forward(s, x):
        b, t, c = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, 2)
        q, k, v = [z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop if s.training else 0)
        x = x + s.d(s.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + s.d(s.fc2(F.gelu(s.fc(s.ln2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte, s.wpe, s.d = nn.Embedding(V, C), nn.Embedding(P, C), nn.Dropout(drop)
        s.blocks = nn.ModuleList([Block() for _ in range(L)])
        s.lnf, s.head = nn.LayerNorm(C), nn.Linear(C, V, bias=False)
        s.head.weight = s.wte.weight

    def forward(s, idx, tgt):
        x = s.d(s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device)))
        for blk in s.blocks:
            x = blk(x)
        return F.cross_entropy(s.head(s.lnf(x)).view(-1, V), tgt.view(-1))


m = GPT().to(dev)
for name, p in m.named_parameters():
    if p.dim() >= 2:
        nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if name.endswith(("proj.weight", "fc2.weight")) else 0.02)
    elif name.endswith("bias"):
        nn.init.zeros_(p)
decay = [p for p in m.parameters() if p.dim() >= 2]
nodecay = [p for p in m.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.99), fused=True)
fwd = torch.compile(m) if a.mode == "compile" else m
ids = torch.randint(V, (B, T + 1), device=dev)
x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def step():
    with torch.autocast("cuda", torch.bfloat16, enabled=a.precision == "bf16"):
        loss = fwd(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    return loss


for _ in range(a.warmup):
    step()
torch.cuda.synchronize()
t0 = time.time()
for _ in range(a.steps):
    loss = step()
torch.cuda.synchronize()
t = time.time() - t0
n = sum(p.numel() for p in m.parameters())
print(f"GPT {a.config} ({L} layers x {C}, {H} heads, vocab {V}, {n} params), B={B} T={T} {a.precision}: "
      f"PyTorch {torch.__version__} {a.mode} {B * T * a.steps / t:.0f} tokens/s ({t / a.steps * 1e3:.2f} ms/step; "
      f"loss {loss.item():.4f})", flush=True)
