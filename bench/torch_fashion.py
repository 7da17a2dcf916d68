#!/usr/bin/python3
"""torch_fashion.py: the PyTorch 1.13 twin of examples/fashion_mnist.c.

The same network, initialization, optimizer, batch, epochs and data order
rules as the C example, so that the two accuracies and epoch times can be set
side by side (docs/fashion.md):

  Fashion-MNIST's "2 Conv+pooling" (TensorFlow's tutorial network):
  conv 5x5, 32, padding "same", ReLU, max-pool 2;
  conv 5x5, 64, padding "same", ReLU, max-pool 2;
  flatten (N, 64*7*7) in NCHW order; dense 1024, ReLU; dropout 0.4; dense 10;
  cross-entropy with label smoothing 0.1; Adam (lr 1e-3, 2e-3 with --bn;
  betas 0.9/0.999, eps 1e-8) with a cosine rate (CosineAnnealingLR,
  T_max = 10 epochs of steps, stepped every step: step t from 0 at
  lr * (1 + cos(pi t / T)) / 2; --schedule exp: the lr times 0.7 after every
  epoch, ExponentialLR), batch 64, the training set shuffled every epoch (the
  last batch is the 32 left over: 938 steps); inputs scaled to [0, 1].
  Default torch initialization (U(+-1/sqrt(fan_in)) for weights and biases,
  as nabla's modules).
  --bn: BatchNorm2d (eps 1e-5, momentum 0.1) after each conv, before the ReLU;
  evaluation in eval mode (running statistics, no dropout).

    /usr/bin/python3 bench/torch_fashion.py [--data DIR] [--epochs 10]
        [--threads 1] [--bn] [--lr 0.001 (--bn: 0.002)] [--schedule cosine|exp]
        [--cosine-epochs 10] [--lr-decay 0.7] [--label-smoothing 0.1]
        [--weight-decay 0] [--seed 1]

DIR holds the four IDX files, gzipped (Debian's dataset-fashion-mnist:
/usr/share/datasets/fashion-mnist, the default) or not (make fashion's
build/data/fashion-mnist). Prints one line per epoch (mean training loss,
test accuracy, epoch time) and, last, `test accuracy 0.9163 (9163/10000)`.

bench/torch_bench.py --fashion imports step_ms() from here for bench
section 10's PyTorch column (random data, no dataset needed).
"""
import argparse
import ctypes
import gzip
import math
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

FILES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
         "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot"]


class Net(nn.Module):
    def __init__(self, bn):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding="same")
        self.conv2 = nn.Conv2d(32, 64, 5, padding="same")
        self.bn1 = nn.BatchNorm2d(32) if bn else nn.Identity()
        self.bn2 = nn.BatchNorm2d(64) if bn else nn.Identity()
        self.fc1 = nn.Linear(64 * 7 * 7, 1024)
        self.fc2 = nn.Linear(1024, 10)

    def forward(self, x):  # x (N, 1, 28, 28) -> logits (N, 10)
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(F.dropout(x, 0.4, self.training))


def set_threads(t):
    """torch's threads (OpenMP, oneDNN) and OpenBLAS's, which this torch build
    does not set with them (Debian's torch calls the system BLAS: the
    dense layers' products run there)."""
    torch.set_num_threads(t)
    torch.zeros(2, 2) @ torch.zeros(2, 2)  # the BLAS is mapped once used
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f if "blas" in line.lower()}
    for path in libs:
        try:
            ctypes.CDLL(path).openblas_set_num_threads(t)
        except (OSError, AttributeError):
            pass


def read_idx(path):
    """An IDX file (gzipped or not) as a tensor of its values (u8 only)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, kind, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or kind != 0x08:
        sys.exit(f"torch_fashion: {path}: not a u8 IDX file")
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = data[4 + 4 * ndim:]
    if len(body) != torch.Size(shape).numel():
        sys.exit(f"torch_fashion: {path}: {len(body)} data bytes, shape {shape}")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(shape)


def load(data_dir):
    out = {}
    for key, name in FILES.items():
        for path in (os.path.join(data_dir, name), os.path.join(data_dir, name + ".gz")):
            if os.path.exists(path):
                out[key] = read_idx(path)
                break
        else:
            sys.exit(f"torch_fashion: no {name}[.gz] in {data_dir} "
                     "(apt-get install dataset-fashion-mnist)")
    for part in ("train", "test"):
        if len(out[part + "_images"]) != len(out[part + "_labels"]):
            sys.exit(f"torch_fashion: {part}: {len(out[part + '_images'])} images but "
                     f"{len(out[part + '_labels'])} labels")
    scale = lambda x: (x.float() / 255.0).unsqueeze(1)  # (N, 1, 28, 28) in [0, 1]
    return (scale(out["train_images"]), out["train_labels"].long(),
            scale(out["test_images"]), out["test_labels"].long())


def train_step(model, opt, x, y, label_smoothing=0.0, autocast=False):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = F.cross_entropy(model(x).float(), y, label_smoothing=label_smoothing)
    loss.backward()
    opt.step()
    return loss.item()


@torch.no_grad()
def correct(model, x, y, batch=1000):
    model.eval()
    n = sum(int((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
            for i in range(0, len(x), batch))
    model.train()
    return n


def step_ms(threads, bn=False, steps=20, warmup=3, batch=64, autocast=False):
    """Median ms of one training step on random data (bench section 13); with
    autocast, its convolutions and linear layers in bf16 (torch.autocast)."""
    set_threads(threads)
    torch.manual_seed(0)
    model = Net(bn)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.rand(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        train_step(model, opt, x, y, autocast=autocast)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    return 1e3 * times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--bn", action="store_true")
    ap.add_argument("--lr", type=float, default=None)  # default: 1e-3, with --bn 2e-3
    ap.add_argument("--lr-decay", type=float, default=0.7)
    ap.add_argument("--schedule", choices=("cosine", "exp"), default="cosine")
    ap.add_argument("--cosine-epochs", type=int, default=10)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.0)  # > 0: AdamW's (decoupled)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.lr is None:
        a.lr = 2e-3 if a.bn else 1e-3  # batch norm takes twice the rate, as the C example
    set_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr, ytr, xte, yte = load(a.data)
    model = Net(a.bn)
    if a.weight_decay > 0:
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    params = sum(p.numel() for p in model.parameters())
    extra = (f", weight decay {a.weight_decay:g}" if a.weight_decay > 0 else "") + \
        (f", label smoothing {a.label_smoothing:g}" if a.label_smoothing > 0 else "")
    schedule = (f" cosine to 0 over {a.cosine_epochs} epochs" if a.schedule == "cosine"
                else f" x{a.lr_decay:g} per epoch")
    print(f"torch {torch.__version__}: fashion-mnist{' --bn' if a.bn else ''}, {params} "
          f"parameters, {len(xtr)} training and {len(xte)} test images, batch {a.batch}, "
          f"{'AdamW' if a.weight_decay > 0 else 'Adam'} lr {a.lr:g}{schedule}"
          f"{extra}, {a.threads} thread(s)", flush=True)
    total, done = 0.0, 0  # seconds training, steps done
    t_max = a.cosine_epochs * ((len(xtr) + a.batch - 1) // a.batch)
    for epoch in range(1, a.epochs + 1):
        t0 = time.perf_counter()
        for group in opt.param_groups:  # ExponentialLR's value, as the C example computes it
            group["lr"] = a.lr * a.lr_decay ** (epoch - 1)
        order = torch.randperm(len(xtr))
        loss_sum, steps = 0.0, 0
        for i in range(0, len(xtr), a.batch):
            idx = order[i:i + a.batch]
            if a.schedule == "cosine":  # CosineAnnealingLR(T_max=t_max) stepped per step
                for group in opt.param_groups:
                    group["lr"] = a.lr * 0.5 * (1.0 + math.cos(math.pi * done / t_max))
            done += 1
            loss_sum += train_step(model, opt, xtr[idx], ytr[idx], a.label_smoothing)
            steps += 1
        dt = time.perf_counter() - t0
        total += dt
        n = correct(model, xte, yte)
        print(f"epoch {epoch:2d}  loss {loss_sum / steps:.4f}  test accuracy {n / len(xte):.4f}  "
              f"epoch time {dt:.1f}s ({1e3 * dt / steps:.1f} ms/step)", flush=True)
    n = correct(model, xte, yte)
    print(f"training {total:.1f}s for {a.epochs} epochs on {a.threads} thread(s)")
    print(f"test accuracy {n / len(xte):.4f} ({n}/{len(xte)})")


if __name__ == "__main__":
    main()
