# net_model.awk: make bench-mpi-net's model of a data-parallel step over a
# network (docs/distributed.md, "The model"), fitted to the rows measured by
# bench/bench_mpi_net.sh and then used for 8 and 64 nodes.
#   awk -v c=MS -v gb=MB -v relay=S -f bench/net_model.awk rows.txt
# c: one process alone (ms per step); gb: gradient MB per step; relay: the
# emulation relay's CPU seconds per GB. rows.txt: "rate delay ms exposed
# overlap window bus" per link (rate Gb/s, delay us; "-" for shared memory).
#
# A step of N ranks, one per host, each sending V = 2 (N-1)/N x G:
#   step = C + kappa V + E
#   E    = max(0, V / r - w (C + kappa V)) + E0 + L d
#   r    = min(eta R, rmax)
# C the computation; kappa the CPU time the network stack takes from the
# cores that compute, per GB sent; w the share of the step during which the
# buckets travel (backward); eta the TCP efficiency on a link of R; rmax the
# rate the stack reaches on these cores; E0 what follows backward when the
# transfers fit in it (the last buckets, the partial bucket's fix-up, the
# copy back); L the one-way latencies per step on the critical path, d the
# one-way delay. The fit: w and eta from the slowest link (its backward runs
# undisturbed, its rate is the link's), rmax the best reduction rate
# measured, L from the delays' difference at the fast links, E0 and kappa
# their means over the fast links (10 Gb/s and up).
function max(a, b) { return a > b ? a : b }
function min(a, b) { return a < b ? a : b }
function model(R, d, C, V) {
    kv = kappa * V
    return C + kv + max(0, V / min(eta * R / 8, rmax) * 1000 - w * (C + kv)) + E0 + L * d
}
# docs/distributed.md's model before this fit: the buckets finished during
# backward (the share of the computation 350/600) travel at the link's
# rate, the embedding's (154 MB) after it, 2 (N-1) messages of 20 us per bucket
function old(R, C, V) {
    return C + max(0, (V - 154e-3) / (R / 8) * 1000 - 350 / 600 * C) + \
           154e-3 / (R / 8) * 1000 + 17 * 2 * 0.02
}
$1 != "-" {
    n++
    R[n] = $1; D[n] = $2 / 1000; ms[n] = $3; ex[n] = $4; W[n] = $5 / 100 * $6; bus[n] = $7
}
$1 == "-" { shm = $3 }
END {
    V = gb / 1000 # 2 ranks: 2 (N-1)/N = 1
    slow = 1
    for (i = 1; i <= n; i++) if (R[i] < R[slow] || (R[i] == R[slow] && D[i] < D[slow])) slow = i
    w = W[slow] / c
    eta = bus[slow] / (R[slow] / 8)
    for (i = 1; i <= n; i++) rmax = max(rmax, bus[i])
    # L: the fast links' step difference between the delays, per ms
    for (i = 1; i <= n; i++)
        for (j = 1; j <= n; j++)
            if (R[i] >= 10 && R[i] == R[j] && D[j] > D[i]) { dl += (ms[j] - ms[i]) / (D[j] - D[i]); nl++ }
    L = nl ? max(0, dl / nl) : 0
    for (i = 1; i <= n; i++)
        if (R[i] >= 10) { e0 += ex[i] - L * D[i]; nf++ }
    E0 = nf ? e0 / nf : 0
    for (i = 1; i <= n; i++)
        if (R[i] >= 10) k += (ms[i] - c - ex[i]) / V
    kappa = nf ? max(0, k / nf) : 0
    printf "The model (docs/distributed.md), fitted here: C %.0f ms (one process alone), w %.2f, eta %.2f, " \
           "rmax %.2f GB/s,\n  kappa %.0f ms per GB sent (of it the emulation's relay: ~%.0f), E0 %.0f ms, " \
           "L %.0f one-way delays per step\n", c, w, eta, rmax, kappa, relay * 1000, E0, L
    printf "%-16s %9s %9s %7s %11s %7s\n", "link", "measured", "model", "error", "old model", "error"
    worst = 0
    for (i = 1; i <= n; i++) {
        m = model(R[i], D[i], c, V); o = old(R[i], c, V)
        e = (m - ms[i]) / ms[i]; worst = max(worst, e < 0 ? -e : e)
        printf "%-16s %6.0f ms %6.0f ms %+6.1f%% %8.0f ms %+6.1f%%\n", sprintf("%g Gb/s, %g ms", R[i], D[i]),
               ms[i], m, 100 * e, o, 100 * (o - ms[i]) / ms[i]
    }
    printf "worst model error %.1f%% (goal: within 15%%)\n", 100 * worst
    for (i = 1; i <= n; i++) {
        if (R[i] == 10)
            printf "10 Gb/s, %g ms: %.0f ms exposed after backward, %.1f%% of the step (goal: at most 10%%)\n",
                   D[i], ex[i], 100 * ex[i] / ms[i]
        if (R[i] == 25)
            printf "25 Gb/s, %g ms: %.0f%% of the step rate over shared memory (%.0f ms; goal: at least 90%%)\n",
                   D[i], 100 * shm / ms[i], shm
    }
    # 8 and 64 nodes like this one: 1 process of 2 threads (C2), a one-way
    # delay of 50 us, no relay (its CPU comes off kappa)
    C2 = c2 ? c2 : 603
    kr = kappa; kappa = max(0, kappa - relay * 1000)
    printf "\nOn paper, GPT-2 124M on nodes like this one (1 process x 2 threads, %.0f ms of computation; " \
           "kappa without the relay %.0f ms/GB; d 50 us):\n", C2, kappa
    printf "%-22s %9s %11s %9s %10s\n", "nodes, link", "sent/node", "exposed", "step", "efficiency"
    split("8 64", nodes, " "); split("25 100", rates, " ")
    for (a = 1; a <= 2; a++)
        for (b = 1; b <= 2; b++) {
            N = nodes[b]; Rr = rates[a]; VN = 2 * (N - 1) / N * V
            s = model(Rr, 0.05 * (N - 1), C2, VN)
            printf "%-22s %6.0f MB %8.0f ms %6.0f ms %9.0f%%\n", sprintf("%d, %d Gb/s", N, Rr), VN * 1000,
                   s - C2 - kappa * VN, s, 100 * C2 / s
        }
    kappa = kr
}
