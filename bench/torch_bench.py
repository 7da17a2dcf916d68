#!/usr/bin/python3
"""torch_bench.py: the PyTorch reference figures that bench/bench.c prints
beside nabla's. Run with Debian's python3-torch (1.13):

    /usr/bin/python3 bench/torch_bench.py [out]  # writes bench/torch_results.txt

Every figure is the median of several timed runs after warm-up runs
(time.perf_counter; fewer for the slow shapes, only 2 for the d512 copy
step), on 1 thread and on all CPUs (torch.set_num_threads), for the same
workloads as bench.c:

  matmul_gflops_{T}t_{M}x{N}x{K}   torch.matmul f32, B contiguous (K, N)
  attn_{fwd,fb}_ms_{T}t_{BxHxLxD}  composed attention (q k^T / sqrt(d),
                                   masked_fill(mask == 0, -1e9), softmax,
                                   dropout 0.1, @ v), causal mask; forward,
                                   and forward + backward of out.sum()
  attn_mem_mib_1x8x1024x64         RSS high-water increment (ru_maxrss) of
                                   one forward + backward, measured first
  mha_fb_ms_{T}t_{BxL}             nn.MultiheadAttention(512, 8, dropout 0.1,
                                   batch_first) self-attention, fwd + bwd
  mlp_{grad,hvp,jvp}_ms_1t         a tanh MLP's gradient, Hessian-vector product
                                   and jvp (bench section 5)
  op_ns_{nograd,record,fb}_1t      a chain of 10,000 tiny ops on (4, 4):
                                   no grad, recording, forward + backward
  copy_ms_{T}t_d{64,512}           one training step of The Annotated
                                   Transformer's copy task (ported below)
  matmul_bf16_gflops_{T}t_{MxNxK}  torch.matmul of two bf16 tensors
  linear[_bf16]_gflops_{T}t_{MxNxK} F.linear(x (M,K), w (N,K)) in f32, and in
                                   bf16 (both operands bf16): GPT-2's shapes
  gpt2_{ms,first_ms,rss_mib}_{T}t  GPT-2 124M (nanoGPT's, tied) training step,
                                   B=4, T=64, AdamW: median of 5 steps after
                                   the first, the first, and the child
                                   process's peak RSS
  bn_{fwd,fb}_ms_{T}t_{NxCxHxW}     F.batch_norm f32, training with running
                                   statistics: forward (no grad), and forward
                                   + backward of y.sum() (--batchnorm: only these)
  gpt2[_bf16][_b1t1024]_...        the same in bf16 (torch.autocast("cpu",
                                   torch.bfloat16) around forward and loss,
                                   f32 weights and AdamW) and at B=1, T=1024
  gpt2_b4t1024[_ckpt]_{ms,first_ms,rss_mib}_{T}t
                                   bench section 8's activation-checkpointing
                                   pair: f32, B=4, T=1024, 3 steps (the median
                                   of the last 2), without and with
                                   torch.utils.checkpoint(block, x, mask,
                                   use_reentrant=False) around each block

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
        LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread \
        /usr/bin/python3 bench/torch_bench.py --gpt2-ckpt [--reentrant] [THREADS...]

                                   only these keys, on all CPUs (or the thread
                                   counts given, e.g. 1 2), merged into
                                   bench/torch_results.txt's others with a
                                   note in its header line; --reentrant also
                                   writes gpt2_b4t1024_ckpt_reentrant_* (torch
                                   1.13's default use_reentrant=True). Each run
                                   waits for 14 GiB available (6 with
                                   checkpointing): PyTorch's plain step needs
                                   ~10+ GiB here. The full run (main) does not
                                   include them: they take minutes.

    /usr/bin/python3 bench/torch_bench.py --fashion [RUNS]  # only these keys:

  fashion[_bn|_bf16]_step_ms_{T}t   examples/fashion_mnist.c's network (_bf16: under
                                   torch.autocast, bf16)
                                   (bench/torch_fashion.py), one training
                                   step of 64 random images, with and
                                   without batch norm (bench section 11)

The file holds `key value` lines and a first comment line naming torch's
version, the date, the CPU and the BLAS library torch loaded (Debian's
python3-torch calls the BLAS that the libblas.so.3 alternative selects, the
reference BLAS on a default install; `update-alternatives --config
libblas.so.3-x86_64-linux-gnu`, or LD_LIBRARY_PATH pointing at another
libblas.so.3 for one run, changes it).

The committed bench/torch_results.txt was made with torch on OpenBLAS 0.3.21
(apt-get install libopenblas0-pthread), the fair comparison:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
        LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread \
        /usr/bin/python3 bench/torch_bench.py

(with OPENBLAS_CORETYPE=Haswell, as this machine's environment sets it,
OpenBLAS runs its AVX2 kernel at about half the speed of the AVX-512 one it
picks by itself, "Cooperlake" here).

On the reference BLAS torch's matmul runs at about 8 GFLOP/s here and every
ratio would flatter nabla 10-40 times more.
"""
import copy
import ctypes
import datetime
import gc
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

OUT = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else \
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_results.txt")
THREADS = sorted({1, os.cpu_count() or 1})
ATTN_SHAPES = [(8, 8, 128, 64), (4, 8, 512, 64), (1, 8, 1024, 64), (2, 4, 64, 32)]
MATMUL_SHAPES = [(n, n, n) for n in (64, 128, 256, 512, 1024)] + \
                [(128, 128, 64), (512, 512, 64), (512, 64, 512)]
BF16_SHAPES = [(1024, 1024, 1024), (256, 256, 256)]
LINEAR_SHAPES = [(256, 2304, 768), (256, 768, 3072), (256, 50257, 768)]  # GPT-2's, B*T = 256
results = {}


def median_ms(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def put(key, value):
    results[key] = value
    print(f"{key:36s} {value:12.4f}", flush=True)


def shape_key(shape):
    return "x".join(str(s) for s in shape)


# ---------------------------------------------------------------- attention
def attention(q, k, v, mask, p):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(mask == 0, -1e9)
    return F.dropout(scores.softmax(dim=-1), p=p, training=True) @ v


def attn_inputs(shape):
    b, h, l, d = shape
    qkv = [torch.randn(b, h, l, d, requires_grad=True) for _ in range(3)]
    return qkv, torch.tril(torch.ones(l, l, dtype=torch.bool))


def attn_fb(qkv, mask):
    attention(*qkv, mask, 0.1).sum().backward()
    for t in qkv:
        t.grad = None


def bench_attn_memory():
    """Run first, so that the process high-water mark is still low."""
    qkv, mask = attn_inputs((1, 8, 1024, 64))
    attn_fb(*attn_inputs((1, 1, 16, 8)))  # lazy initialisation, not the workload
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    attn_fb(qkv, mask)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    put("attn_mem_mib_1x8x1024x64", (after - before) / 1024.0)


def bench_attention(t):
    for shape in ATTN_SHAPES:
        qkv, mask = attn_inputs(shape)
        big = shape[2] >= 512
        reps = 3 if big else 7
        fwd = median_ms(lambda: attention(*qkv, mask, 0.1), 1, reps)
        fb = median_ms(lambda: attn_fb(qkv, mask), 1, reps)
        put(f"attn_fwd_ms_{t}t_{shape_key(shape)}", fwd)
        put(f"attn_fb_ms_{t}t_{shape_key(shape)}", fb)


# ---------------------------------------------------------------- matmul, MHA
def bench_matmul(t):
    for m, n, k in MATMUL_SHAPES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        flops = 2.0 * m * n * k
        inner = max(1, int(2e7 / flops))
        reps = 3 if flops > 1e9 else 5

        def run():
            for _ in range(inner):
                torch.matmul(a, b)
        ms = median_ms(run, 1, reps) / inner
        put(f"matmul_gflops_{t}t_{m}x{n}x{k}", flops / (ms * 1e6))


def gflops(fn, flops):
    inner = max(1, int(2e8 / flops))

    def run():
        for _ in range(inner):
            fn()
    return flops / (median_ms(run, 1, 5) / inner * 1e6)


def bench_matmul_bf16(t):
    for m, n, k in BF16_SHAPES:
        a, b = torch.randn(m, k).bfloat16(), torch.randn(k, n).bfloat16()
        put(f"matmul_bf16_gflops_{t}t_{m}x{n}x{k}", gflops(lambda: torch.matmul(a, b), 2.0 * m * n * k))
    for m, n, k in LINEAR_SHAPES:
        x, w = torch.randn(m, k), torch.randn(n, k)
        put(f"linear_gflops_{t}t_{m}x{n}x{k}", gflops(lambda: F.linear(x, w), 2.0 * m * n * k))
        xb, wb = x.bfloat16(), w.bfloat16()
        put(f"linear_bf16_gflops_{t}t_{m}x{n}x{k}", gflops(lambda: F.linear(xb, wb), 2.0 * m * n * k))


def bench_mha(t):
    mha = nn.MultiheadAttention(512, 8, dropout=0.1, batch_first=True).train()
    for b, l in ((8, 128), (4, 512)):
        x = torch.randn(b, l, 512, requires_grad=True)

        def fb():
            mha(x, x, x, need_weights=False)[0].sum().backward()
            mha.zero_grad(set_to_none=True)
            x.grad = None
        put(f"mha_fb_ms_{t}t_{b}x{l}", median_ms(fb, 1, 5 if l < 512 else 3))


# ---------------------------------------------------------------- per-op overhead
CHAIN = 10000


def chain(x):
    y = x
    for i in range(CHAIN):
        y = y * 1.0001 if i % 2 == 0 else y + x
    return y


def bench_overhead():
    x = torch.randn(4, 4, requires_grad=True)

    def nograd():
        with torch.no_grad():
            y = chain(x)
        del y

    def record():
        y = chain(x)
        del y  # frees the graph, as nabla's nb_scope_end does

    def fb():
        chain(x).sum().backward()
        x.grad = None
    for name, fn in (("nograd", nograd), ("record", record), ("fb", fb)):
        put(f"op_ns_{name}_1t", median_ms(fn, 2, 11) * 1e6 / CHAIN)


# Second order and forward mode on a tanh MLP (32,64) -> 256 -> 256 -> 1, f32,
# 1 thread: a gradient, a Hessian-vector product (create_graph, then a second
# backward) and torch.func.jvp (torch 1.13: functorch.jvp).
def mlp_loss(x, w):
    h = torch.tanh(x @ w[0])
    h = torch.tanh(h @ w[1])
    return (h @ w[2]).mean()


def bench_second_order():
    torch.manual_seed(4)
    x = torch.randn(32, 64)
    w = [torch.randn(*s, requires_grad=True) for s in ((64, 256), (256, 256), (256, 1))]
    v = [torch.randn_like(t) for t in w]

    def grad():
        torch.autograd.grad(mlp_loss(x, w), w)

    def hvp():
        g = torch.autograd.grad(mlp_loss(x, w), w, create_graph=True)
        gv = sum((a * b).sum() for a, b in zip(g, v))
        torch.autograd.grad(gv, w)

    def jvp():
        from functorch import jvp as fjvp
        fjvp(lambda *ws: mlp_loss(x, ws), tuple(t.detach() for t in w), tuple(v))
    for name, fn in (("grad", grad), ("hvp", hvp), ("jvp", jvp)):
        put(f"mlp_{name}_ms_1t", median_ms(fn, 2, 15))


# ---------------------------------------------------------------- copy task
# A small port of The Annotated Transformer (harvardnlp, 2022 version):
# pre-norm sublayers, its own LayerNorm, sinusoidal positions, xavier init.
def clones(module, n):
    return nn.ModuleList([copy.deepcopy(module) for _ in range(n)])


class LayerNorm(nn.Module):
    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class SublayerConnection(nn.Module):
    def __init__(self, size, dropout):
        super().__init__()
        self.norm = LayerNorm(size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, sublayer):
        return x + self.dropout(sublayer(self.norm(x)))


class EncoderLayer(nn.Module):
    def __init__(self, size, self_attn, feed_forward, dropout):
        super().__init__()
        self.self_attn, self.feed_forward = self_attn, feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout), 2)
        self.size = size

    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)


class Encoder(nn.Module):
    def __init__(self, layer, n):
        super().__init__()
        self.layers = clones(layer, n)
        self.norm = LayerNorm(layer.size)

    def forward(self, x, mask):
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class DecoderLayer(nn.Module):
    def __init__(self, size, self_attn, src_attn, feed_forward, dropout):
        super().__init__()
        self.size = size
        self.self_attn, self.src_attn, self.feed_forward = self_attn, src_attn, feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout), 3)

    def forward(self, x, memory, src_mask, tgt_mask):
        m = memory
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, tgt_mask))
        x = self.sublayer[1](x, lambda x: self.src_attn(x, m, m, src_mask))
        return self.sublayer[2](x, self.feed_forward)


class Decoder(nn.Module):
    def __init__(self, layer, n):
        super().__init__()
        self.layers = clones(layer, n)
        self.norm = LayerNorm(layer.size)

    def forward(self, x, memory, src_mask, tgt_mask):
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


def ta_attention(query, key, value, mask=None, dropout=None):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        self.d_k, self.h = d_model // h, h
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask=None):
        if mask is not None:
            mask = mask.unsqueeze(1)
        nbatches = query.size(0)
        query, key, value = [lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
                             for lin, x in zip(self.linears, (query, key, value))]
        x, _ = ta_attention(query, key, value, mask=mask, dropout=self.dropout)
        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        return self.linears[-1](x)


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.w_2(self.dropout(self.w_1(x).relu()))


class Embeddings(nn.Module):
    def __init__(self, d_model, vocab):
        super().__init__()
        self.lut, self.d_model = nn.Embedding(vocab, d_model), d_model

    def forward(self, x):
        return self.lut(x) * math.sqrt(self.d_model)


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout, max_len=5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return self.dropout(x + self.pe[:, : x.size(1)].requires_grad_(False))


class EncoderDecoder(nn.Module):
    def __init__(self, encoder, decoder, src_embed, tgt_embed, generator):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.src_embed, self.tgt_embed, self.generator = src_embed, tgt_embed, generator

    def forward(self, src, tgt, src_mask, tgt_mask):
        memory = self.encoder(self.src_embed(src), src_mask)
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)


def make_model(src_vocab, tgt_vocab, n=6, d_model=512, d_ff=2048, h=8, dropout=0.1):
    c = copy.deepcopy
    attn = MultiHeadedAttention(h, d_model)
    ff = PositionwiseFeedForward(d_model, d_ff, dropout)
    position = PositionalEncoding(d_model, dropout)
    model = EncoderDecoder(
        Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout), n),
        Decoder(DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout), n),
        nn.Sequential(Embeddings(d_model, src_vocab), c(position)),
        nn.Sequential(Embeddings(d_model, tgt_vocab), c(position)),
        nn.Linear(d_model, tgt_vocab))  # logits: cross entropy replaces LabelSmoothing
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return model


def subsequent_mask(size):
    return torch.tril(torch.ones(1, size, size, dtype=torch.bool))


VOCAB, SEQ, BATCH = 11, 10, 80


def copy_step(model, opt):
    src = torch.randint(1, VOCAB, (BATCH, SEQ))
    src[:, 0] = 1
    tgt_in, tgt_y = src[:, :-1], src[:, 1:]
    src_mask = (src != 0).unsqueeze(-2)
    tgt_mask = (tgt_in != 0).unsqueeze(-2) & subsequent_mask(tgt_in.size(-1))
    logits = model.generator(model(src, tgt_in, src_mask, tgt_mask))
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt_y.reshape(-1), ignore_index=0)
    loss.backward()
    opt.step()
    opt.zero_grad()


def bench_copy(t):
    # d512 steps take seconds each with a reference BLAS: fewer of them
    for d_model, d_ff, heads, warmup, reps in ((64, 256, 4, 2, 11), (512, 2048, 8, 1, 2)):
        torch.manual_seed(1)
        model = make_model(VOCAB, VOCAB, n=2, d_model=d_model, d_ff=d_ff, h=heads).train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        put(f"copy_ms_{t}t_d{d_model}", median_ms(lambda: copy_step(model, opt), warmup, reps))


# ---------------------------------------------------------------- GPT-2 124M
# nanoGPT's GPT-2 (pre-LN, causal, GELU tanh, tied lm_head), one training step
# on B=4 x T=64 random tokens: loss, backward, AdamW (lr 1e-4, no decay),
# zero_grad(set_to_none=True). Each thread count runs in a child process (this
# script with --gpt2-child T) so that ru_maxrss is that run's own.
class GPTBlock(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.c_attn, self.attn_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.c_fc, self.mlp_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.h)
        att = F.softmax(att.masked_fill(~mask[:t, :t], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab=50257, block=1024, layers=12, heads=12, c=768):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(block, c)
        self.h = nn.ModuleList(GPTBlock(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.register_buffer("mask", torch.tril(torch.ones(block, block, dtype=torch.bool)))

    def forward(self, idx, targets, ckpt=0):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            if ckpt:  # torch.utils.checkpoint around each block; 1: use_reentrant=False
                x = torch.utils.checkpoint.checkpoint(block, x, self.mask, use_reentrant=ckpt == 2)
            else:
                x = block(x, self.mask)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def gpt2_child(t, b, seq, bf16, ckpt=0, steps=6):
    """One configuration in this fresh process: prints the first step's ms, the
    median ms of the other steps, ru_maxrss in MiB and the losses (hex)."""
    set_threads(t)
    torch.manual_seed(0)
    model = GPT2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    tok = torch.randint(0, 50257, (b, seq + 1))
    x, y = tok[:, :seq], tok[:, 1:]
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(x, y, ckpt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item().hex())
        del loss
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"gpt2 {1e3 * times[0]:.1f} {1e3 * statistics.median(times[1:]):.1f} {rss:.1f} "
          + ",".join(losses))


def mem_available_gib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


def bench_gpt2(t, b=4, seq=64, bf16=False, ckpt=0, steps=6, need_gib=0):
    """ckpt: 0 none, 1 torch.utils.checkpoint(use_reentrant=False) per block,
    2 the same with use_reentrant=True (torch 1.13's default). need_gib: wait
    (up to an hour) until /proc/meminfo's MemAvailable shows that much."""
    import subprocess
    waited = 0
    while mem_available_gib() < need_gib and waited < 3600:
        print(f"  {mem_available_gib():.1f} GiB available, waiting for {need_gib}", flush=True)
        time.sleep(30)
        waited += 30
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--gpt2-child", str(t),
                          str(b), str(seq), str(int(bf16)), str(ckpt), str(steps)],
                         capture_output=True, text=True, check=True).stdout.split()
    first, median, rss = (float(v) for v in out[1:4])
    key = "gpt2" + ("_bf16" if bf16 else "") + (f"_b{b}t{seq}" if seq == 1024 else "") + \
        ("", "_ckpt", "_ckpt_reentrant")[ckpt]
    put(f"{key}_first_ms_{t}t", first)
    put(f"{key}_ms_{t}t", median)
    put(f"{key}_rss_mib_{t}t", rss)
    print(f"  losses {out[4]}", flush=True)
    return out[4]


# ---------------------------------------------------------------- GPT-2 generation
# Greedy decoding of GPT-2 124M (the GPT2 class above, random weights, eval,
# no grad) with a key/value cache written by hand (torch 1.13 has none built
# in): each new token runs one position through the blocks and attends over
# the cached keys and values, as nb_gpt_generate does. tokens/s is 1 / the
# median time per token over 32 tokens after a prompt of plen tokens. bf16:
# the whole model in bfloat16 (model.to(torch.bfloat16)), as a PyTorch user
# halves the bytes per token.
GEN_TOKENS = 32


@torch.no_grad()
def gen_rate(model, plen, dtype):
    c, nh = model.wte.weight.shape[1], model.h[0].h
    d = c // nh
    kc = [torch.zeros(1, nh, 1024, d, dtype=dtype) for _ in model.h]
    vc = [torch.zeros(1, nh, 1024, d, dtype=dtype) for _ in model.h]

    def feed(idx, pos):
        n = idx.shape[1]
        x = model.wte(idx) + model.wpe(torch.arange(pos, pos + n))
        for i, b in enumerate(model.h):
            q, k, v = b.c_attn(b.ln_1(x)).split(c, dim=2)
            q, k, v = (z.view(1, n, nh, d).transpose(1, 2) for z in (q, k, v))
            kc[i][:, :, pos:pos + n] = k
            vc[i][:, :, pos:pos + n] = v
            att = (q @ kc[i][:, :, :pos + n].transpose(-2, -1)) / math.sqrt(d)
            if n > 1:
                att = att.masked_fill(~model.mask[pos:pos + n, :pos + n], float("-inf"))
            y = (F.softmax(att, dim=-1) @ vc[i][:, :, :pos + n]).transpose(1, 2).reshape(1, n, c)
            x = x + b.attn_proj(y)
            x = x + b.mlp_proj(F.gelu(b.c_fc(b.ln_2(x)), approximate="tanh"))
        return model.lm_head(model.ln_f(x[:, -1]))

    prompt = torch.tensor([[(i * 7919 + 13) % 50257 for i in range(plen)]])
    logits, pos, times = feed(prompt, 0), plen, []
    for _ in range(GEN_TOKENS):
        t0 = time.perf_counter()
        logits = feed(logits.argmax(-1).view(1, 1), pos)
        times.append(time.perf_counter() - t0)
        pos += 1
    return 1.0 / statistics.median(times)


def bench_generate(t):
    torch.manual_seed(0)
    model = GPT2().eval()
    for bf16 in (False, True):
        if bf16:
            model = model.to(torch.bfloat16)
        dtype = torch.bfloat16 if bf16 else torch.float32
        for plen in (1, 512):
            put(f"gen{'_bf16' if bf16 else ''}_tok_s_{t}t_p{plen}", gen_rate(model, plen, dtype))


# ---------------------------------------------------------------- main
def blas_name():
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "blas" in line.lower()}
        return ",".join(sorted(os.path.realpath(p) for p in libs)) or "none mapped"
    except OSError:
        return "unknown"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def openblas_core():
    """The kernel OpenBLAS picked (OPENBLAS_CORETYPE forces one: unset it,
    and OPENBLAS_L2_SIZE, for this command alone, or it runs slower here)."""
    for path in blas_name().split(","):
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
        except (OSError, AttributeError):
            pass
    return "not OpenBLAS"


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def set_threads(t):
    """torch's intra-op threads and, when torch runs on OpenBLAS, its threads
    too (this torch build does not forward the setting to its BLAS)."""
    torch.set_num_threads(t)
    for path in blas_name().split(","):
        try:
            ctypes.CDLL(path).openblas_set_num_threads(t)
        except (OSError, AttributeError):
            pass


def main():
    start = time.perf_counter()
    load_before = loadavg()
    torch.manual_seed(0)
    set_threads(1)
    bench_attn_memory()
    bench_overhead()
    bench_second_order()
    for t in THREADS:
        set_threads(t)
        bench_matmul(t)
        bench_attention(t)
        bench_mha(t)
        bench_copy(t)
        bench_gpt2(t)
        bench_matmul_bf16(t)
        bench_gpt2(t, bf16=True)
        bench_gpt2(t, 1, 1024)
        bench_gpt2(t, 1, 1024, bf16=True)
        bench_generate(t)
        bench_batchnorm(t)
        bench_conv(t)
    version = ".".join(torch.__version__.split(".")[:2])
    header = (f"# torch {version}, {datetime.date.today().isoformat()}, {cpu_model()}, "
              f"{os.cpu_count()} CPUs, BLAS {blas_name()} (kernel {openblas_core()}), "
              f"load average {load_before} before, {loadavg()} after")
    # the keys of the partial runs this one does not repeat stay, with their parts
    parts, old = read_results(("# torch", "gen_* keys", "bn_* keys", "conv_* keys"))
    kept = {k: v for k, v in old.items() if k not in results and
            k.startswith(("fashion", "gpt2_b4t1024", "gpttrain_"))}
    write_results([header] + parts, {**results, **kept})
    print(f"wrote {OUT} in {time.perf_counter() - start:.0f} s", file=sys.stderr)


# ------------------------------------------------------- the results file
# OUT's first line is a header of "; "-separated parts, one per set of keys
# (the full run's, then "bn_* keys ...", "gpttrain_* keys ..." and so on);
# each partial run replaces its own part and keys and keeps the others.
def read_results(drop):
    """OUT's header parts not starting with any prefix of drop, and its values."""
    parts, old = [], {}
    if os.path.exists(OUT):
        with open(OUT) as f:
            parts = [p for p in f.readline().rstrip("\n").split("; ")
                     if p and not p.startswith(tuple(drop))]
            for line in f:
                key, value = line.split()
                old[key] = float(value)
    return parts, old


def write_results(parts, values):
    with open(OUT, "w") as f:
        f.write("; ".join(parts) + "\n")
        for key, value in values.items():
            f.write(f"{key} {value:.6g}\n")


# --------------------------------------------------------------- batch norm
BN_SHAPES = [(64, 32, 28, 28), (64, 64, 14, 14)]  # the Fashion-MNIST network's, batch 64


def bench_batchnorm(t):
    for shape in BN_SHAPES:
        x = torch.randn(shape, requires_grad=True)
        w = torch.randn(shape[1], requires_grad=True)
        b = torch.randn(shape[1], requires_grad=True)
        rm, rv = torch.zeros(shape[1]), torch.ones(shape[1])

        def fwd():
            with torch.no_grad():
                F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5)

        def fb():
            F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5).sum().backward()
            x.grad = w.grad = b.grad = None

        put(f"bn_fwd_ms_{t}t_{shape_key(shape)}", median_ms(fwd, 2, 15))
        put(f"bn_fb_ms_{t}t_{shape_key(shape)}", median_ms(fb, 2, 15))


def update_batchnorm():
    """--batchnorm: only the batch norm figures, merged into OUT's others."""
    parts, old = read_results(("bn_* keys",))
    for t in THREADS:
        set_threads(t)
        bench_batchnorm(t)
    old.update(results)
    write_results(parts + [f"bn_* keys {datetime.date.today().isoformat()}, load average "
                           f"{loadavg()} after"], old)


# The Fashion-MNIST network's conv layers (bench.c section 11): batch 64,
# f32, padding "same"; backward = forward + backward - forward, conv1's input
# needing no gradient (as in the network).
CONV_LAYERS = [("conv1", 1, 28, 32, 5, False), ("conv2", 32, 14, 64, 5, True)]


def bench_conv(t):
    """Forward and backward timed apart inside one training-like loop (the
    forward with grad on, then backward of its result): the medians of 31
    after 5 warm-up calls. Timed as forward+backward minus a no-grad forward
    (nabla's way), PyTorch's backward came out negative for conv1: its
    no-grad forward alone (4-5 ms) was slower than forward and backward
    together (~1 ms), as glibc's heap kept or returned the 6.4 MB output
    depending on what ran before."""
    torch.manual_seed(0)
    for name, c, h, o, k, grad_x in CONV_LAYERS:
        x = torch.randn(64, c, h, h, requires_grad=grad_x)
        w = torch.randn(o, c, k, k, requires_grad=True)
        b = torch.randn(o, requires_grad=True)
        g = torch.randn(64, o, h, h)
        tf, tb = [], []
        for i in range(36):
            t0 = time.perf_counter()
            y = F.conv2d(x, w, b, padding="same")
            t1 = time.perf_counter()
            y.backward(g)
            t2 = time.perf_counter()
            x.grad = w.grad = b.grad = None
            del y
            if i >= 5:
                tf.append(t1 - t0)
                tb.append(t2 - t1)
        put(f"conv_{name}_fwd_ms_{t}t", 1e3 * statistics.median(tf))
        put(f"conv_{name}_bwd_ms_{t}t", 1e3 * statistics.median(tb))


def update_conv():
    """--conv: only the conv_* figures, merged into OUT's others."""
    parts, old = read_results(("conv_* keys",))
    before = loadavg()
    for t in THREADS:
        set_threads(t)
        bench_conv(t)
    old.update(results)
    write_results(parts + [f"conv_* keys {datetime.date.today().isoformat()}, load average "
                           f"{before} before, {loadavg()} after"], old)


def update_generate(runs=3):
    """--generate [RUNS]: only the generation figures, each the median of RUNS
    runs (on a shared machine one run's 2-thread figures can collapse),
    merged into OUT's others."""
    parts, old = read_results(("gen_* keys",))
    before, per_key = loadavg(), {}
    for _ in range(runs):
        for t in THREADS:
            set_threads(t)
            bench_generate(t)
        for key, value in results.items():
            per_key.setdefault(key, []).append(value)
    old.update({key: statistics.median(v) for key, v in per_key.items()})
    write_results(parts + [f"gen_* keys {datetime.date.today().isoformat()}, medians of {runs} "
                           f"runs, load average {before} before, {loadavg()} after"], old)


def update_fashion(runs=3):
    """--fashion [RUNS]: only bench section 11's figures, examples/fashion_mnist.c's
    network (bench/torch_fashion.py): fashion[_bn]_step_ms_{T}t, the median ms
    of a training step of a batch of 64 random images, each the median of
    RUNS runs, merged into OUT's others."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_fashion import step_ms
    parts, old = read_results(("fashion_* keys",))
    before, per_key = loadavg(), {}
    for _ in range(runs):
        for t in THREADS:
            set_threads(t)
            for bn, ac in ((False, False), (True, False), (False, True)):
                key = f"fashion{'_bn' if bn else ''}{'_bf16' if ac else ''}_step_ms_{t}t"
                per_key.setdefault(key, []).append(step_ms(t, bn, autocast=ac))
                print(f"{key:36s} {per_key[key][-1]:12.4f}", flush=True)
    old.update({key: statistics.median(v) for key, v in per_key.items()})
    write_results(parts + [f"fashion_* keys {datetime.date.today().isoformat()}, medians of "
                           f"{runs} runs, load average {before} before, {loadavg()} after"], old)


def cpu_family_model():
    """'AMD EPYC family 25 model 17 (Zen 4)' from /proc/cpuinfo."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, v = (z.strip() for z in line.split(":", 1))
                    info.setdefault(k, v)
    except OSError:
        return cpu_model()
    fam, mod = info.get("cpu family", "?"), info.get("model", "?")
    zen = {("25", "17"): " (Zen 4)"}.get((fam, mod), " (Zen 5)" if fam == "26" else "")
    return f"{info.get('model name', 'unknown')} family {fam} model {mod}{zen}"


def update_gpt2_ckpt(args):
    """--gpt2-ckpt [--reentrant] [THREADS...]: only bench section 8's
    activation-checkpointing pair, GPT-2 124M f32 B=4 T=1024, 3 steps in a
    fresh process each (the median of the last 2, as bench.c), with and
    without torch.utils.checkpoint(use_reentrant=False) around each block:
    gpt2_b4t1024[_ckpt]_{ms,first_ms,rss_mib}_{T}t on all CPUs (or on the
    thread counts given), merged into OUT's others, with a header note per
    set of thread counts ("gpt2_b4t1024*_2t keys ..."). --reentrant also runs
    use_reentrant=True (torch 1.13's default): gpt2_b4t1024_ckpt_reentrant_*.
    Each run first waits for 14 GiB available (6 with checkpointing)."""
    reentrant = "--reentrant" in args
    threads = [int(a) for a in args if a != "--reentrant"] or [os.cpu_count() or 1]
    tag = "gpt2_b4t1024*_" + ",".join(f"{t}t" for t in threads) + " keys"
    parts, old = read_results((tag, "gpt2_b4t1024* keys"))
    before, all_same = loadavg(), True
    for t in threads:
        losses = {}
        for ckpt in (0, 1, 2) if reentrant else (0, 1):
            losses[ckpt] = bench_gpt2(t, 4, 1024, ckpt=ckpt, steps=3, need_gib=6 if ckpt else 14)
        all_same &= len(set(losses.values())) == 1
        print(f"  {t} threads: losses with and without checkpointing "
              f"{'the same' if len(set(losses.values())) == 1 else 'NOT the same'}", flush=True)
    old.update(results)
    write_results(parts + [
        f"{tag} {datetime.date.today().isoformat()} on "
        f"{cpu_family_model()}, 3 steps in a fresh process, the median of the last 2, "
        f"_ckpt: torch.utils.checkpoint(use_reentrant=False) per block"
        f"{', _ckpt_reentrant: use_reentrant=True' if reentrant else ''}, losses bitwise "
        f"{'the same' if all_same else 'NOT the same'} as without, load average {before} before, "
        f"{loadavg()} after"], old)


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--conv":
        update_conv()
    elif len(sys.argv) in (2, 3) and sys.argv[1] == "--fashion":
        update_fashion(int(sys.argv[2]) if len(sys.argv) == 3 else 3)
    elif len(sys.argv) in (2, 3) and sys.argv[1] == "--generate":
        update_generate(int(sys.argv[2]) if len(sys.argv) == 3 else 3)
    elif len(sys.argv) == 2 and sys.argv[1] == "--batchnorm":
        update_batchnorm()
    elif len(sys.argv) >= 2 and sys.argv[1] == "--gpt2-ckpt":
        update_gpt2_ckpt(sys.argv[2:])
    elif len(sys.argv) in (6, 8) and sys.argv[1] == "--gpt2-child":
        gpt2_child(*(int(v) for v in sys.argv[2:5]), sys.argv[5] == "1",
                   *(int(v) for v in sys.argv[6:8]))
    else:
        main()
