/* tests/mpi/net_relay.c: a user-space switch with delay between emulated
 * hosts (network namespaces), for links with latency on a kernel without
 * netem (issue 29; tests/mpi/net_delay_check.sh measures it).
 *
 *   net_relay [--delay-us D] [--mtu M] [--no-offload] [--spin-us S]
 *             [--ring-mb R] NS:DEV:A.B.C.D[/LEN] NS:DEV:A.B.C.D[/LEN] ...
 *
 * For each host it creates (or attaches to) the TUN device DEV inside the
 * namespace NS (/var/run/netns/NS, as `ip netns add` makes it, or NS itself
 * when it holds a '/': /proc/self/ns/net is the relay's own, where an mpirun
 * that starts its orteds in the other namespaces runs), gives it
 * the address A.B.C.D/LEN (default /24), the MTU M (default 65535) and brings
 * it up, so the host's IPv4 traffic to the other hosts' addresses comes to
 * the relay. Each packet read from a host's device is held D microseconds
 * (from when it was read) and then written to the device of the host that
 * owns its IPv4 destination; anything else (IPv6, an unknown destination) is
 * dropped and counted.
 *
 * What it emulates: a one-way delay D between any two hosts (an RTT of 2D),
 * as netem's "delay D" on each host's egress would, plus what the relay
 * itself costs (a read and a write of each packet: 10-20 us more RTT than a
 * veth and a bridge, measured by the check at D = 0). A rate is not the relay's
 * business: shape each host's TUN with tbf in its namespace, as on a veth.
 * The queue is FIFO per sending host (one thread per host reads its device
 * and writes its packets out when due), so packets from one host to another
 * keep their order, as on a real link.
 *
 * Throughput: by default the devices carry a virtio-net header
 * (IFF_VNET_HDR) and take TUNSETOFFLOAD(CSUM, TSO4, TSO6), so TCP hands the
 * relay 64 KB super-packets whose checksums nobody computes: a packet costs
 * one read and one write (two copies), whatever its size. --no-offload turns
 * that off (plain IP packets, checksums in software), for comparison. One
 * TCP stream at D = 1000 us with 32 MB TCP buffers, on the 2-core VM of
 * make net-delay-check, moved 18-28 Gb/s so (0.3-0.5 CPU s per GB in the
 * relay, half of it the two copies), 15-19 Gb/s with --no-offload, 12 Gb/s
 * with --mtu 1500 (TSO still making 64 KB packets) and 2 Gb/s with both
 * (1500-byte packets: the per-packet cost rules). Packets
 * wait in a preallocated byte ring per sending host (--ring-mb, default 64
 * MB: 20 ms at 25 Gb/s); when it is full, packets are dropped and counted.
 *
 * The timer: ppoll until the oldest packet is due, with the thread's timer
 * slack at 1 ns. A wake-up from ppoll comes some 20-30 us late in this VM
 * (more under load), which would add that much to every hold: each thread
 * learns its wake-ups' lateness (a running mean) and aims that much before
 * the due time; woken early, it spins on the clock until the due time, at
 * most --spin-us S (default 10) microseconds, or sleeps again. --spin-us 0:
 * no spinning and no aiming early (every hold a wake-up's lateness long).
 * The cores are shared with the training: S bounds what the precision costs.
 *
 * SIGINT or SIGTERM: the relay stops, closes the devices (those it created
 * go with it; one made persistent beforehand, e.g. by `ip tuntap add`,
 * stays), and reports on stderr packets and bytes per host, the hold time
 * actually applied (min, median, p99, max), the drops by cause and its CPU
 * time. Exit status 0, or 1 when the setup or a device failed. Needs root
 * (CAP_NET_ADMIN in the namespaces). Its devices hold their namespaces: one
 * deleted by `ip netns del` while the relay runs lives on, unnamed and still
 * relayed, until the relay exits; stop the relay first. */
#define _GNU_SOURCE /* setns, CLONE_NEWNET, ppoll */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_HOSTS 64
#define VNET_HDR 10                          /* struct virtio_net_hdr */
#define MAX_PKT (VNET_HDR + 65535)           /* one read of a device */
#define SLOT ((MAX_PKT + 63) & ~(size_t)63)   /* what a packet may take of a ring */
#define HIST_US (1 << 17)                    /* hold histogram: 1 us bins up to 131 ms */
#define READ_BATCH 64                        /* packets read per wake-up at most */

struct host {
    const char *spec; /* NS:DEV:ADDR as given */
    char ns[256];
    char dev[IFNAMSIZ];
    struct in_addr addr;
    int prefix;
    int fd; /* the TUN device, -1 until open */
};

struct pkt {
    size_t off;   /* in the ring */
    uint32_t len; /* bytes, virtio header included */
    int dst;      /* host index */
    int64_t t_in; /* ns, CLOCK_MONOTONIC, when read */
};

/* One per sending host: its ring, its queue and its counters (no locks: a
 * worker alone touches its own; writes to another host's fd are single
 * syscalls, which a TUN device takes from any thread). */
struct worker {
    int src;
    pthread_t thread;
    unsigned char *buf; /* byte ring, cap bytes */
    size_t cap, w;
    struct pkt *q; /* FIFO of held packets */
    size_t qcap, qhead, qn;
    unsigned char *scratch; /* a dropped packet is read here */
    uint64_t in_pkts, in_bytes;
    uint64_t out_pkts[MAX_HOSTS], out_bytes[MAX_HOSTS];
    uint64_t drop_not_ipv4, drop_unknown, drop_full, drop_write, drop_exit;
    int last_write_errno;
    uint32_t *hist; /* hold time, 1 us bins */
    int64_t hold_min, hold_max;
    uint64_t hold_n;
    int64_t late_ns; /* the running mean of ppoll's lateness on a timeout */
};

static struct host hosts[MAX_HOSTS];
static int nhosts;
static int64_t delay_ns;
static int64_t spin_ns = 10000;
static int vnet = 1; /* IFF_VNET_HDR + offloads */
static int stop_fd = -1;
static atomic_int stopping;
static atomic_int failed;

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: net_relay [--delay-us D] [--mtu M] [--no-offload] [--spin-us S] [--ring-mb R]\n"
            "                 NS:DEV:A.B.C.D[/LEN] NS:DEV:A.B.C.D[/LEN] ...\n"
            "  a TUN device DEV in each namespace NS (/var/run/netns/NS, or a path such as\n"
            "  /proc/self/ns/net) with the address A.B.C.D/LEN (default /24); IPv4 packets\n"
            "  between the hosts are held D us (default 0) and delivered to the device of\n"
            "  their destination. --mtu M: 68..65535 (default 65535); --no-offload: no\n"
            "  virtio header, no TSO/checksum offload; --spin-us S: spin at most S us\n"
            "  before a due packet (0..1000, default 10); --ring-mb R: held bytes per\n"
            "  sending host (1..4096, default 64). Root only.\n"
            "  SIGINT/SIGTERM: stop, remove the devices, report on stderr.\n");
}

/* a whole decimal number in [lo, hi], or -1 after saying what is wrong */
static long long parse_num(const char *flag, const char *s, long long lo, long long hi)
{
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s) {
        fprintf(stderr, "net_relay: %s needs a value\n", flag);
        return -1;
    }
    if (errno || *end || v < lo || v > hi) {
        fprintf(stderr, "net_relay: %s %s: not a whole number in [%lld, %lld]\n", flag, s, lo, hi);
        return -1;
    }
    return v;
}

static int parse_host(const char *spec, struct host *h)
{
    const char *c1 = strchr(spec, ':');
    const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c1 || !c2 || c1 == spec || c2 == c1 + 1 || !c2[1]) {
        fprintf(stderr, "net_relay: host '%s': expected NS:DEV:A.B.C.D[/LEN]\n", spec);
        return -1;
    }
    size_t nl = (size_t)(c1 - spec), dl = (size_t)(c2 - c1 - 1);
    if (nl >= sizeof h->ns) {
        fprintf(stderr, "net_relay: host '%s': namespace name of %zu characters (at most %zu)\n", spec, nl,
                sizeof h->ns - 1);
        return -1;
    }
    if (dl >= IFNAMSIZ) {
        fprintf(stderr, "net_relay: host '%s': device name of %zu characters (at most %d)\n", spec, dl,
                IFNAMSIZ - 1);
        return -1;
    }
    memcpy(h->ns, spec, nl);
    h->ns[nl] = 0;
    memcpy(h->dev, c1 + 1, dl);
    h->dev[dl] = 0;
    if (strchr(h->dev, '/') || strchr(h->dev, ' ')) {
        fprintf(stderr, "net_relay: host '%s': device name '%s' holds '/' or ' '\n", spec, h->dev);
        return -1;
    }
    char a[64];
    const char *slash = strchr(c2 + 1, '/');
    size_t al = slash ? (size_t)(slash - c2 - 1) : strlen(c2 + 1);
    if (al >= sizeof a) {
        fprintf(stderr, "net_relay: host '%s': address too long\n", spec);
        return -1;
    }
    memcpy(a, c2 + 1, al);
    a[al] = 0;
    if (inet_pton(AF_INET, a, &h->addr) != 1) {
        fprintf(stderr, "net_relay: host '%s': '%s' is not an IPv4 address\n", spec, a);
        return -1;
    }
    h->prefix = 24;
    if (slash) {
        long long p = parse_num("prefix length", slash + 1, 1, 32);
        if (p < 0)
            return -1;
        h->prefix = (int)p;
    }
    h->spec = spec;
    h->fd = -1;
    return 0;
}

static int ifreq_ioctl(int sock, unsigned long req, struct ifreq *ifr, const char *what, const struct host *h)
{
    if (ioctl(sock, req, ifr) < 0) {
        fprintf(stderr, "net_relay: ioctl(%s) on %s in namespace %s: %s\n", what, h->dev, h->ns,
                strerror(errno));
        return -1;
    }
    return 0;
}

/* In the host's namespace (the caller has entered it): the address, the
 * netmask, the MTU, no IPv6 (its router solicitations would only be dropped),
 * up. */
static int configure(const struct host *h, int mtu)
{
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0) {
        fprintf(stderr, "net_relay: socket(AF_INET) in namespace %s: %s\n", h->ns, strerror(errno));
        return -1;
    }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, h->dev);
    ifr.ifr_mtu = mtu;
    int rc = ifreq_ioctl(sock, SIOCSIFMTU, &ifr, "SIOCSIFMTU", h);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr = h->addr;
    memcpy(&ifr.ifr_addr, &sa, sizeof sa);
    if (!rc)
        rc = ifreq_ioctl(sock, SIOCSIFADDR, &ifr, "SIOCSIFADDR", h);
    sa.sin_addr.s_addr = htonl(h->prefix == 32 ? 0xffffffffu : ~(0xffffffffu >> h->prefix));
    memcpy(&ifr.ifr_netmask, &sa, sizeof sa);
    if (!rc)
        rc = ifreq_ioctl(sock, SIOCSIFNETMASK, &ifr, "SIOCSIFNETMASK", h);
    char path[64 + IFNAMSIZ];
    snprintf(path, sizeof path, "/proc/sys/net/ipv6/conf/%s/disable_ipv6", h->dev);
    int f = open(path, O_WRONLY | O_CLOEXEC); /* absent without IPv6: fine */
    if (f >= 0) {
        if (write(f, "1\n", 2) != 2) { /* not fatal: IPv6 packets are dropped and counted anyway */
        }
        close(f);
    }
    if (!rc)
        rc = ifreq_ioctl(sock, SIOCGIFFLAGS, &ifr, "SIOCGIFFLAGS", h);
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (!rc)
        rc = ifreq_ioctl(sock, SIOCSIFFLAGS, &ifr, "SIOCSIFFLAGS", h);
    close(sock);
    return rc;
}

/* The host's TUN device, opened in its namespace; the caller's namespace
 * (orig_ns) is entered again before returning. */
static int open_tun(struct host *h, int orig_ns, int mtu)
{
    char path[300];
    if (strchr(h->ns, '/'))
        snprintf(path, sizeof path, "%s", h->ns);
    else
        snprintf(path, sizeof path, "/var/run/netns/%s", h->ns);
    int nsfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0) {
        fprintf(stderr, "net_relay: open(%s) for host '%s': %s\n", path, h->spec, strerror(errno));
        return -1;
    }
    if (setns(nsfd, CLONE_NEWNET) < 0) {
        fprintf(stderr, "net_relay: setns(%s, CLONE_NEWNET): %s%s\n", path, strerror(errno),
                errno == EPERM ? " (needs root)" : "");
        close(nsfd);
        return -1;
    }
    close(nsfd);
    int rc = -1;
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "net_relay: open(/dev/net/tun) in namespace %s: %s\n", h->ns, strerror(errno));
        goto back;
    }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, h->dev);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI | (vnet ? IFF_VNET_HDR : 0);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
        fprintf(stderr, "net_relay: ioctl(TUNSETIFF, %s, IFF_TUN|IFF_NO_PI%s) in namespace %s: %s%s\n", h->dev,
                vnet ? "|IFF_VNET_HDR" : "", h->ns, strerror(errno),
                errno == EPERM ? " (needs root)" : errno == EBUSY ? " (the device is in use)"
                : errno == EINVAL ? " (a device of that name that is not a TUN, or other flags)" : "");
        goto fail;
    }
    if (vnet) {
        int sz = VNET_HDR;
        if (ioctl(fd, TUNSETVNETHDRSZ, &sz) < 0) {
            fprintf(stderr, "net_relay: ioctl(TUNSETVNETHDRSZ, %d) on %s: %s\n", sz, h->dev, strerror(errno));
            goto fail;
        }
        unsigned long off = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
        if (ioctl(fd, TUNSETOFFLOAD, off) < 0) {
            fprintf(stderr, "net_relay: ioctl(TUNSETOFFLOAD, CSUM|TSO4|TSO6) on %s: %s\n", h->dev,
                    strerror(errno));
            goto fail;
        }
    }
    if (configure(h, mtu) < 0)
        goto fail;
    h->fd = fd;
    rc = 0;
    goto back;
fail:
    close(fd);
back:
    if (setns(orig_ns, CLONE_NEWNET) < 0) {
        fprintf(stderr, "net_relay: setns(back to the first namespace): %s\n", strerror(errno));
        if (h->fd >= 0)
            close(h->fd);
        h->fd = -1;
        rc = -1;
    }
    return rc;
}

static int lookup(uint32_t dst) /* network order */
{
    for (int i = 0; i < nhosts; i++)
        if (hosts[i].addr.s_addr == dst)
            return i;
    return -1;
}

/* Where the next packet may be read into the ring (SLOT contiguous bytes
 * that no held packet uses), or NULL when the ring is full. A packet of n
 * bytes takes n rounded up to 64 of them. */
static unsigned char *ring_slot(struct worker *wk)
{
    if (wk->qn == wk->qcap)
        return NULL;
    if (wk->qn == 0) {
        wk->w = 0;
        return wk->buf;
    }
    size_t h = wk->q[wk->qhead].off;
    if (wk->w >= h) {
        if (wk->cap - wk->w >= SLOT)
            return wk->buf + wk->w;
        if (h > SLOT) { /* wrap */
            wk->w = 0;
            return wk->buf;
        }
        return NULL;
    }
    return h - wk->w > SLOT ? wk->buf + wk->w : NULL;
}

static void fatal_stop(void)
{
    atomic_store(&failed, 1);
    kill(getpid(), SIGUSR1); /* main waits for it in sigwait */
}

/* Write out every held packet whose time has come. */
static void send_due(struct worker *wk)
{
    while (wk->qn) {
        struct pkt *p = &wk->q[wk->qhead];
        int64_t due = p->t_in + delay_ns;
        int64_t t = now_ns();
        if (t < due) {
            if (due - t > spin_ns)
                return;
            while ((t = now_ns()) < due) /* at most spin_ns */
                ;
        }
        ssize_t n = write(hosts[p->dst].fd, wk->buf + p->off, p->len);
        if (n == (ssize_t)p->len) {
            wk->out_pkts[p->dst]++;
            wk->out_bytes[p->dst] += p->len - (vnet ? VNET_HDR : 0);
        } else {
            wk->drop_write++;
            wk->last_write_errno = n < 0 ? errno : 0;
        }
        int64_t hold = t - p->t_in;
        if (!wk->hold_n || hold < wk->hold_min)
            wk->hold_min = hold;
        if (hold > wk->hold_max)
            wk->hold_max = hold;
        wk->hold_n++;
        int64_t us = hold / 1000;
        wk->hist[us < HIST_US ? us : HIST_US - 1]++;
        wk->qhead = (wk->qhead + 1) % wk->qcap;
        wk->qn--;
    }
}

/* Read what the host's device has, up to READ_BATCH packets; 0 or -1 when
 * the device failed. */
static int read_some(struct worker *wk)
{
    struct host *h = &hosts[wk->src];
    const size_t hdr = vnet ? VNET_HDR : 0;
    for (int i = 0; i < READ_BATCH; i++) {
        unsigned char *slot = ring_slot(wk);
        unsigned char *into = slot ? slot : wk->scratch;
        ssize_t n = read(h->fd, into, MAX_PKT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return 0;
            fprintf(stderr, "net_relay: read(%s in %s): %s\n", h->dev, h->ns, strerror(errno));
            return -1;
        }
        int64_t t = now_ns();
        wk->in_pkts++;
        wk->in_bytes += (uint64_t)n - ((size_t)n >= hdr ? hdr : 0);
        if ((size_t)n < hdr + 20 || (into[hdr] >> 4) != 4) {
            wk->drop_not_ipv4++;
            continue;
        }
        uint32_t dst;
        memcpy(&dst, into + hdr + 16, 4);
        int d = lookup(dst);
        if (d < 0 || d == wk->src) {
            wk->drop_unknown++;
            continue;
        }
        if (!slot) {
            wk->drop_full++;
            continue;
        }
        size_t tail = (wk->qhead + wk->qn) % wk->qcap;
        wk->q[tail] = (struct pkt){(size_t)(slot - wk->buf), (uint32_t)n, d, t};
        wk->qn++;
        wk->w = (size_t)(slot - wk->buf) + (((size_t)n + 63) & ~(size_t)63);
        send_due(wk); /* at D = 0, at once */
    }
    return 0;
}

static void *work(void *arg)
{
    struct worker *wk = arg;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    struct pollfd pf[2] = {{hosts[wk->src].fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    while (!atomic_load(&stopping)) {
        send_due(wk);
        struct timespec ts, *tsp = NULL;
        int64_t t = 0, wait = 0;
        if (wk->qn) {
            /* aim the learned lateness early (with spinning on), or at the
             * start of the spin window when that aim has passed */
            t = now_ns();
            int64_t rem = wk->q[wk->qhead].t_in + delay_ns - t;
            wait = rem - (spin_ns ? wk->late_ns : 0);
            if (wait <= 0)
                wait = rem > spin_ns ? rem - spin_ns : 0;
            ts.tv_sec = wait / 1000000000;
            ts.tv_nsec = wait % 1000000000;
            tsp = &ts;
        }
        int r = ppoll(pf, 2, tsp, NULL);
        if (r == 0 && wait > 0) {
            int64_t late = now_ns() - (t + wait);
            if (late > 200000) /* a descheduled thread says nothing of the timer */
                late = 200000;
            wk->late_ns += (late - wk->late_ns) / 8;
        }
        if (r < 0 && errno != EINTR) {
            fprintf(stderr, "net_relay: ppoll(%s): %s\n", hosts[wk->src].dev, strerror(errno));
            fatal_stop();
            break;
        }
        if (r > 0 && (pf[1].revents & POLLIN))
            break;
        if (r > 0 && (pf[0].revents & (POLLERR | POLLHUP | POLLNVAL))) {
            fprintf(stderr, "net_relay: device %s in %s failed (poll revents 0x%x)\n", hosts[wk->src].dev,
                    hosts[wk->src].ns, (unsigned)pf[0].revents);
            fatal_stop();
            break;
        }
        if (r > 0 && (pf[0].revents & POLLIN) && read_some(wk) < 0) {
            fatal_stop();
            break;
        }
    }
    wk->drop_exit = wk->qn;
    return NULL;
}

int main(int argc, char **argv)
{
    long long mtu = 65535, ring_mb = 64;
    int i = 1;
    for (; i < argc && argv[i][0] == '-' && argv[i][1] == '-'; i++) {
        const char *a = argv[i];
        long long v;
        if (!strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--delay-us")) {
            if ((v = parse_num(a, i + 1 < argc ? argv[++i] : NULL, 0, 10000000)) < 0)
                goto bad;
            delay_ns = v * 1000;
        } else if (!strcmp(a, "--spin-us")) {
            if ((v = parse_num(a, i + 1 < argc ? argv[++i] : NULL, 0, 1000)) < 0)
                goto bad;
            spin_ns = v * 1000;
        } else if (!strcmp(a, "--mtu")) {
            if ((mtu = parse_num(a, i + 1 < argc ? argv[++i] : NULL, 68, 65535)) < 0)
                goto bad;
        } else if (!strcmp(a, "--ring-mb")) {
            if ((ring_mb = parse_num(a, i + 1 < argc ? argv[++i] : NULL, 1, 4096)) < 0)
                goto bad;
        } else if (!strcmp(a, "--no-offload")) {
            vnet = 0;
        } else {
            fprintf(stderr, "net_relay: unknown option '%s'\n", a);
            goto bad;
        }
    }
    nhosts = argc - i;
    if (nhosts < 2 || nhosts > MAX_HOSTS) {
        fprintf(stderr, "net_relay: %d hosts given: needs 2 to %d\n", nhosts, MAX_HOSTS);
        goto bad;
    }
    for (int k = 0; k < nhosts; k++) {
        if (parse_host(argv[i + k], &hosts[k]) < 0)
            goto bad;
        for (int j = 0; j < k; j++) {
            if (hosts[j].addr.s_addr == hosts[k].addr.s_addr) {
                fprintf(stderr, "net_relay: hosts '%s' and '%s' have the same address\n", hosts[j].spec,
                        hosts[k].spec);
                goto bad;
            }
            if (!strcmp(hosts[j].ns, hosts[k].ns) && !strcmp(hosts[j].dev, hosts[k].dev)) {
                fprintf(stderr, "net_relay: hosts '%s' and '%s' name the same device\n", hosts[j].spec,
                        hosts[k].spec);
                goto bad;
            }
        }
    }

    int rc = 1;
    struct worker *wks = calloc((size_t)nhosts, sizeof *wks);
    int orig_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (!wks || orig_ns < 0) {
        fprintf(stderr, "net_relay: %s: %s\n", !wks ? "calloc(workers)" : "open(/proc/self/ns/net)",
                strerror(errno));
        free(wks);
        if (orig_ns >= 0)
            close(orig_ns);
        return 1;
    }
    /* SIGINT/SIGTERM/SIGHUP (and SIGUSR1 from a failing worker) are taken by
     * sigwait in this thread; the workers inherit the mask. SIGPIPE can't
     * come from a TUN device, but is ignored all the same. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGHUP);
    sigaddset(&sigs, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    size_t cap = (size_t)ring_mb << 20;
    if (cap < 2 * SLOT)
        cap = 2 * SLOT;
    int started = 0;
    int64_t t0 = 0, t1 = 0;
    for (int k = 0; k < nhosts; k++) {
        if (open_tun(&hosts[k], orig_ns, (int)mtu) < 0)
            goto out;
        struct worker *wk = &wks[k];
        wk->src = k;
        wk->cap = cap;
        wk->qcap = cap / 128 + 1; /* more packets than that (of 128 bytes on average, or less) are dropped */
        wk->buf = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (wk->buf == MAP_FAILED) {
            wk->buf = NULL;
            fprintf(stderr, "net_relay: mmap(%zu bytes of ring): %s\n", cap, strerror(errno));
            goto out;
        }
        wk->q = malloc(wk->qcap * sizeof *wk->q);
        wk->scratch = malloc(MAX_PKT);
        wk->hist = calloc(HIST_US, sizeof *wk->hist);
        if (!wk->q || !wk->scratch || !wk->hist) {
            fprintf(stderr, "net_relay: malloc(queue of %zu packets and histogram): %s\n", wk->qcap,
                    strerror(errno));
            goto out;
        }
    }
    stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (stop_fd < 0) {
        fprintf(stderr, "net_relay: eventfd: %s\n", strerror(errno));
        goto out;
    }
    t0 = now_ns();
    for (; started < nhosts; started++) {
        int e = pthread_create(&wks[started].thread, NULL, work, &wks[started]);
        if (e) {
            fprintf(stderr, "net_relay: pthread_create(worker of %s): %s\n", hosts[started].spec, strerror(e));
            goto out;
        }
    }
    printf("net_relay: ready: %d hosts, delay %lld us, mtu %lld, %s, ring %lld MB per host\n", nhosts,
           (long long)(delay_ns / 1000), mtu, vnet ? "offload (vnet header, TSO, checksum)" : "no offload",
           ring_mb);
    fflush(stdout);

    int sig = 0;
    sigwait(&sigs, &sig);
    rc = atomic_load(&failed) ? 1 : 0;
    t1 = now_ns();

out:
    atomic_store(&stopping, 1);
    if (stop_fd >= 0) {
        uint64_t one = 1;
        if (write(stop_fd, &one, sizeof one) != sizeof one)
            fprintf(stderr, "net_relay: eventfd write: %s\n", strerror(errno));
    }
    for (int k = 0; k < started; k++)
        pthread_join(wks[k].thread, NULL);
    if (started == nhosts) {
        /* the report */
        double secs = (double)(t1 - t0) / 1e9;
        uint64_t moved = 0, holds = 0, hmin = 0, hmax = 0;
        uint64_t dn4 = 0, dunk = 0, dfull = 0, dwr = 0, dexit = 0;
        int werr = 0;
        fprintf(stderr, "net_relay: ran %.2f s, delay %lld us, mtu %lld, %s\n", secs,
                (long long)(delay_ns / 1000), mtu, vnet ? "offload" : "no offload");
        for (int k = 0; k < nhosts; k++) {
            struct worker *wk = &wks[k];
            uint64_t op = 0, ob = 0;
            for (int d = 0; d < nhosts; d++) {
                op += wks[d].out_pkts[k];
                ob += wks[d].out_bytes[k];
            }
            moved += ob;
            char a[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &hosts[k].addr, a, sizeof a);
            fprintf(stderr, "net_relay: host %s (%s in %s): read %llu packets %llu bytes, delivered to it %llu packets %llu bytes\n",
                    a, hosts[k].dev, hosts[k].ns, (unsigned long long)wk->in_pkts,
                    (unsigned long long)wk->in_bytes, (unsigned long long)op, (unsigned long long)ob);
            if (wk->hold_n) {
                if (!holds || (uint64_t)wk->hold_min < hmin)
                    hmin = (uint64_t)wk->hold_min;
                if ((uint64_t)wk->hold_max > hmax)
                    hmax = (uint64_t)wk->hold_max;
            }
            holds += wk->hold_n;
            dn4 += wk->drop_not_ipv4;
            dunk += wk->drop_unknown;
            dfull += wk->drop_full;
            dwr += wk->drop_write;
            dexit += wk->drop_exit;
            if (wk->drop_write)
                werr = wk->last_write_errno;
        }
        if (holds) {
            /* median and p99 from the merged 1 us histogram */
            uint64_t seen = 0, med = 0, p99 = 0;
            int have_med = 0;
            for (int b = 0; b < HIST_US; b++) {
                uint64_t c = 0;
                for (int k = 0; k < nhosts; k++)
                    c += wks[k].hist[b];
                seen += c;
                if (!have_med && 2 * seen >= holds) {
                    med = (uint64_t)b;
                    have_med = 1;
                }
                if (100 * seen >= 99 * holds) {
                    p99 = (uint64_t)b;
                    break;
                }
            }
            fprintf(stderr, "net_relay: hold us: min %.1f median %llu p99 %llu max %.1f (%llu packets; bins of 1 us)\n",
                    hmin / 1e3, (unsigned long long)med, (unsigned long long)p99, hmax / 1e3,
                    (unsigned long long)holds);
        } else {
            fprintf(stderr, "net_relay: hold us: no packet relayed\n");
        }
        fprintf(stderr, "net_relay: drops: not IPv4 %llu, unknown destination %llu, ring full %llu, write failed %llu%s%s, held at exit %llu\n",
                (unsigned long long)dn4, (unsigned long long)dunk, (unsigned long long)dfull,
                (unsigned long long)dwr, dwr ? ", last: " : "", dwr ? (werr ? strerror(werr) : "short write") : "",
                (unsigned long long)dexit);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
                     ru.ru_stime.tv_usec / 1e6;
        fprintf(stderr, "net_relay: cpu %.3f s (user %.3f, sys %.3f), %llu bytes delivered, %.3f cpu s per GB\n", cpu,
                (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
                (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6, (unsigned long long)moved,
                moved ? cpu / ((double)moved / 1e9) : 0.0);
    }
    for (int k = 0; k < nhosts; k++) {
        if (hosts[k].fd >= 0)
            close(hosts[k].fd);
        if (wks[k].buf)
            munmap(wks[k].buf, wks[k].cap);
        free(wks[k].q);
        free(wks[k].scratch);
        free(wks[k].hist);
    }
    free(wks);
    if (stop_fd >= 0)
        close(stop_fd);
    close(orig_ns);
    return rc;
bad:
    usage(stderr);
    return 2;
}
