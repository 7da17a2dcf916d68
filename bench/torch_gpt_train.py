#!/usr/bin/python3
"""torch_gpt_train.py: the PyTorch half of make bench-train (bench/bench_train.sh).

It trains, in PyTorch, the model and recipe that build/examples/gpt trains
in nabla, and measures the same things: nanoGPT's CPU run (its README's
"shakespeare_char on a MacBook" shape) on the bytes of examples/data/kjv.txt.
Written for this benchmark in nanoGPT's spirit, not copied from it.

Model: nabla's nb_GPT (nn/gpt.c) with bias false, i.e.
  wte (256, 128) + wpe (64, 128), both N(0, 0.02)
  4 pre-LN blocks: x += c_proj(attn(c_attn(ln_1(x)))); x += c_proj(gelu_tanh(c_fc(ln_2(x))))
    linears without bias, weights N(0, 0.02), the two c_proj N(0, 0.02 / sqrt(2 * n_layer));
    layer norms (eps 1e-5) as nn/gpt.c makes them with bias false (weight 1, and a bias 0
    when nn/gpt.c keeps one: --ln-bias 1|0, bench_train.sh passes what nabla does)
    attention: 4 heads of 32, causal, softmax(q k^T / sqrt(32)) v, no dropout
    MLP 4x with GELU's tanh approximation (nabla's; nanoGPT uses erf)
  ln_f, lm_head tied to wte.
Recipe: random batches of 12 windows of 65 bytes of the train part (the first
90% of the file's bytes; val is the last 10%), AdamW betas (0.9, 0.99), eps
1e-8, weight decay 0.1 on every parameter with >= 2 dims (embeddings
included), none on 1-D ones; grad clip 1.0; lr 1e-3 with nanoGPT's get_lr:
linear warmup lr * (it + 1) / (warmup + 1) for it < 100, then cosine to
min_lr 1e-4 at lr_decay_iters 2000.

Timing: each step's time is measured around the whole step (batch, forward,
loss, backward, clip, AdamW, zero_grad) with time.perf_counter, as
examples/gpt.c's "step N: loss X (Y ms)" line is; the training time is the
sum of the step times (no evaluation inside). Validation: the val bytes cut
into consecutive non-overlapping windows of 64 (window w: inputs
val[64w .. 64w+63], targets val[64w+1 .. 64w+64], w < floor((n-1)/64)), the
mean cross-entropy over all their targets, no grad, model.eval(), f32 (and
under autocast for --dtype bf16, as training).

Prints "step N: loss X (Y ms)" lines like examples/gpt.c, then one line
  result torch <dtype> threads=<n> steps=<s> ms_median=<m> train_s=<t> val_loss=<v> val_windows=<w>
and "blas <libraries torch loaded>" (from /proc/self/maps).

Run with Debian's python3-torch on OpenBLAS (see bench/torch_bench.py):
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread \\
        /usr/bin/python3 bench/torch_gpt_train.py --threads 1
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H, ln_bias):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C, eps=1e-5, elementwise_affine=True)
        self.c_attn = nn.Linear(C, 3 * C, bias=False)
        self.attn_proj = nn.Linear(C, C, bias=False)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5, elementwise_affine=True)
        self.c_fc = nn.Linear(C, 4 * C, bias=False)
        self.mlp_proj = nn.Linear(4 * C, C, bias=False)
        if not ln_bias:  # a layer norm with a weight only
            self.ln_1.bias = None
            self.ln_2.bias = None

    def attention(self, x, mask):
        B, T, C = x.shape
        H, D = self.H, C // self.H
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, H, D).transpose(1, 2)
        v = v.view(B, T, H, D).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(mask[:T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.attn_proj(y)

    def forward(self, x, mask):
        x = x + self.attention(self.ln_1(x), mask)
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, V=256, T=64, L=4, H=4, C=128, ln_bias=True):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H, ln_bias) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        if not ln_bias:
            self.ln_f.bias = None
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))
        std, proj_std = 0.02, 0.02 / math.sqrt(2 * L)
        for name, p in self.named_parameters():
            if p.dim() >= 2:  # embeddings and linear weights; LN weight 1, bias 0 as made
                nn.init.normal_(p, 0.0, proj_std if name.endswith("proj.weight") else std)

    def forward(self, idx):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x, self.mask)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied lm_head


def get_lr(it, lr, min_lr, warmup, decay_iters):
    """nanoGPT's get_lr"""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup) / (decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def blas_libraries():
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({l.split()[-1] for l in f if "blas" in l.lower() and "/" in l})
        return ",".join(libs) or "none found in /proc/self/maps"
    except OSError:
        return "unknown"


def openblas_core():
    try:
        import ctypes
        for lib in blas_libraries().split(","):
            if "openblas" in lib:
                h = ctypes.CDLL(lib)
                h.openblas_get_corename.restype = ctypes.c_char_p
                return h.openblas_get_corename().decode()
    except (OSError, AttributeError):
        pass
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="examples/data/kjv.txt")
    ap.add_argument("--val-split", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--lr-decay-steps", type=int, default=2000)
    ap.add_argument("--ln-bias", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--quiet", action="store_true", help="no step lines")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    with open(a.data, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    n_train = int(len(data) * (1.0 - a.val_split))  # as examples/gpt.c's --val-split
    train, val = data[:n_train], data[n_train:]
    B, T = a.batch, a.block

    model = GPT(T=T, ln_bias=bool(a.ln_bias))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.99), eps=1e-8)
    autocast = a.dtype == "bf16"
    gen = torch.Generator().manual_seed(a.seed)
    offs = torch.arange(T + 1)

    times = []
    model.train()
    for it in range(a.steps):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = get_lr(it, a.lr, a.min_lr, a.warmup, a.lr_decay_steps)
        starts = torch.randint(len(train) - T, (B,), generator=gen)
        rows = train[starts[:, None] + offs]
        x, y = rows[:, :T], rows[:, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = loss.item()
        ms = 1000 * (time.perf_counter() - t0)
        times.append(ms)
        if not a.quiet:
            print(f"step {it + 1}: loss {lv:.6f} ({ms:.1f} ms)", flush=True)
        if not math.isfinite(lv):
            sys.exit(f"step {it + 1}: loss is {lv}")

    # validation: every window of the val part, batched, no grad
    model.eval()
    W = (len(val) - 1) // T
    total, count = 0.0, 0
    with torch.no_grad():
        for w0 in range(0, W, 64):
            w = torch.arange(w0, min(W, w0 + 64))
            idx = w[:, None] * T + torch.arange(T)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(val[idx])
            total += F.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                     val[idx + 1].reshape(-1), reduction="sum").item()
            count += idx.numel()
    core = openblas_core()
    print(f"blas {blas_libraries()}" + (f" (OpenBLAS kernel {core})" if core else ""))
    print(f"result torch {a.dtype} threads={a.threads} steps={a.steps} "
          f"ms_median={statistics.median(times):.2f} train_s={sum(times) / 1000:.2f} "
          f"val_loss={total / count:.4f} val_windows={W} torch={torch.__version__} "
          f"openblas_threads={os.environ.get('OPENBLAS_NUM_THREADS', 'default')}")


if __name__ == "__main__":
    main()
