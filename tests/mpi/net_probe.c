/* tests/mpi/net_probe.c: the measuring end of tests/mpi/net_delay_check.sh
 * (this machine has neither ping nor iperf):
 *
 *   net_probe ping ADDR COUNT INTERVAL_MS
 *       ICMP echo (a raw socket, as ping; root), one request at a time, each
 *       waited for at most 1 s: prints "rtt_us min M median M avg A max X
 *       lost L of COUNT".
 *   net_probe sink PORT SECONDS
 *       accepts one TCP connection on PORT and reads it to its end (or
 *       SECONDS): prints "sink bytes B seconds S gbps G", the rate from the
 *       first byte to the last.
 *   net_probe send ADDR PORT SECONDS
 *       connects (retrying for 5 s while the sink starts) and writes 1 MB
 *       buffers for SECONDS: prints "send bytes B seconds S gbps G".
 *
 * Every mode is bounded in time. Socket buffers are left to the kernel's
 * autotuning (net.ipv4.tcp_rmem and tcp_wmem of the namespace). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/ip_icmp.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1 << 20)

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static long num(const char *what, const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !*s || *end || v < lo || v > hi) {
        fprintf(stderr, "net_probe: %s '%s': not a whole number in [%ld, %ld]\n", what, s, lo, hi);
        exit(2);
    }
    return v;
}

static struct in_addr addr_of(const char *s)
{
    struct in_addr a;
    if (inet_pton(AF_INET, s, &a) != 1) {
        fprintf(stderr, "net_probe: '%s' is not an IPv4 address\n", s);
        exit(2);
    }
    return a;
}

static uint16_t csum(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint32_t s = 0;
    for (size_t i = 0; i + 1 < n; i += 2)
        s += (uint32_t)(b[i] << 8 | b[i + 1]);
    if (n & 1)
        s += (uint32_t)b[n - 1] << 8;
    while (s >> 16)
        s = (s & 0xffff) + (s >> 16);
    return htons((uint16_t)~s);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int do_ping(const char *host, long count, long interval_ms)
{
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_addr = addr_of(host)};
    int s = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_ICMP);
    if (s < 0) {
        fprintf(stderr, "net_probe: socket(AF_INET, SOCK_RAW, IPPROTO_ICMP): %s%s\n", strerror(errno),
                errno == EPERM ? " (needs root)" : "");
        return 1;
    }
    double *rtt = malloc((size_t)count * sizeof *rtt);
    if (!rtt) {
        fprintf(stderr, "net_probe: malloc(%ld rtts): %s\n", count, strerror(errno));
        close(s);
        return 1;
    }
    uint16_t id = (uint16_t)getpid();
    long got = 0;
    for (long seq = 0; seq < count; seq++) {
        unsigned char pkt[64] = {0};
        struct icmphdr *ic = (struct icmphdr *)pkt;
        ic->type = ICMP_ECHO;
        ic->un.echo.id = htons(id);
        ic->un.echo.sequence = htons((uint16_t)seq);
        ic->checksum = csum(pkt, sizeof pkt);
        double t0 = now_s();
        if (sendto(s, pkt, sizeof pkt, 0, (struct sockaddr *)&to, sizeof to) < 0) {
            fprintf(stderr, "net_probe: sendto(%s): %s\n", host, strerror(errno));
            free(rtt);
            close(s);
            return 1;
        }
        for (;;) { /* the matching reply, within 1 s */
            int left = (int)((t0 + 1.0 - now_s()) * 1000);
            struct pollfd pf = {s, POLLIN, 0};
            if (left <= 0 || poll(&pf, 1, left) <= 0)
                break;
            unsigned char in[256];
            ssize_t n = recv(s, in, sizeof in, 0);
            double t1 = now_s();
            if (n < (ssize_t)sizeof(struct iphdr))
                continue;
            size_t hl = (size_t)(in[0] & 15) * 4;
            if ((size_t)n < hl + sizeof(struct icmphdr))
                continue;
            struct icmphdr *r = (struct icmphdr *)(in + hl);
            if (r->type == ICMP_ECHOREPLY && ntohs(r->un.echo.id) == id && ntohs(r->un.echo.sequence) == seq) {
                rtt[got++] = (t1 - t0) * 1e6;
                break;
            }
        }
        double next = t0 + interval_ms / 1e3;
        while (now_s() < next) {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
    close(s);
    if (!got) {
        printf("rtt_us none lost %ld of %ld\n", count, count);
        free(rtt);
        return 1;
    }
    qsort(rtt, (size_t)got, sizeof *rtt, cmp_d);
    double sum = 0;
    for (long i = 0; i < got; i++)
        sum += rtt[i];
    printf("rtt_us min %.1f median %.1f avg %.1f max %.1f lost %ld of %ld\n", rtt[0], rtt[got / 2], sum / got,
           rtt[got - 1], count - got, count);
    free(rtt);
    return 0;
}

static int do_sink(long port, long secs)
{
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 1) < 0) {
        fprintf(stderr, "net_probe: sink on port %ld: %s\n", port, strerror(errno));
        if (l >= 0)
            close(l);
        return 1;
    }
    double end = now_s() + secs;
    struct pollfd pf = {l, POLLIN, 0};
    if (poll(&pf, 1, (int)(secs * 1000)) <= 0) {
        fprintf(stderr, "net_probe: sink on port %ld: no connection in %ld s\n", port, secs);
        close(l);
        return 1;
    }
    int c = accept(l, NULL, NULL);
    close(l);
    if (c < 0) {
        fprintf(stderr, "net_probe: accept on port %ld: %s\n", port, strerror(errno));
        return 1;
    }
    char *buf = malloc(CHUNK);
    if (!buf) {
        fprintf(stderr, "net_probe: malloc(%d): %s\n", CHUNK, strerror(errno));
        close(c);
        return 1;
    }
    unsigned long long bytes = 0;
    double first = 0, last = 0;
    for (;;) {
        struct pollfd cp = {c, POLLIN, 0};
        int left = (int)((end - now_s()) * 1000);
        if (left <= 0 || poll(&cp, 1, left) <= 0)
            break;
        ssize_t n = recv(c, buf, CHUNK, 0);
        if (n <= 0)
            break;
        last = now_s();
        if (!bytes)
            first = last;
        bytes += (unsigned long long)n;
    }
    close(c);
    free(buf);
    double d = last - first;
    printf("sink bytes %llu seconds %.3f gbps %.3f\n", bytes, d, d > 0 ? bytes * 8 / d / 1e9 : 0.0);
    return bytes ? 0 : 1;
}

static int do_send(const char *host, long port, long secs)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr = addr_of(host)};
    int s = -1;
    double give_up = now_s() + 5;
    for (;;) {
        s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0) {
            fprintf(stderr, "net_probe: socket: %s\n", strerror(errno));
            return 1;
        }
        if (connect(s, (struct sockaddr *)&a, sizeof a) == 0)
            break;
        int e = errno;
        close(s);
        if (now_s() > give_up) {
            fprintf(stderr, "net_probe: connect(%s:%ld): %s\n", host, port, strerror(e));
            return 1;
        }
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    char *buf = malloc(CHUNK);
    if (!buf) {
        fprintf(stderr, "net_probe: malloc(%d): %s\n", CHUNK, strerror(errno));
        close(s);
        return 1;
    }
    memset(buf, 0x5a, CHUNK);
    unsigned long long bytes = 0;
    double t0 = now_s(), t = t0;
    while ((t = now_s()) < t0 + secs) {
        ssize_t n = send(s, buf, CHUNK, MSG_NOSIGNAL);
        if (n < 0) {
            fprintf(stderr, "net_probe: send(%s:%ld): %s\n", host, port, strerror(errno));
            break;
        }
        bytes += (unsigned long long)n;
    }
    close(s);
    free(buf);
    printf("send bytes %llu seconds %.3f gbps %.3f\n", bytes, t - t0, bytes * 8 / (t - t0) / 1e9);
    return 0;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc == 5 && !strcmp(argv[1], "ping"))
        return do_ping(argv[2], num("COUNT", argv[3], 1, 100000), num("INTERVAL_MS", argv[4], 0, 10000));
    if (argc == 4 && !strcmp(argv[1], "sink"))
        return do_sink(num("PORT", argv[2], 1, 65535), num("SECONDS", argv[3], 1, 3600));
    if (argc == 5 && !strcmp(argv[1], "send"))
        return do_send(argv[2], num("PORT", argv[3], 1, 65535), num("SECONDS", argv[4], 1, 3600));
    fprintf(stderr, "usage: net_probe ping ADDR COUNT INTERVAL_MS | sink PORT SECONDS | send ADDR PORT SECONDS\n");
    return 2;
}
