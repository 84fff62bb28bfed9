/*
 * A slow, lossy wire between two TAP devices, in user space: what `tc qdisc
 * add ... netem delay 1ms loss 0.1%` does, for kernels without sch_netem.
 * Every Ethernet frame read from one device is written to the other after
 * DELAY_US microseconds, unless it is dropped (LOSS_PER_MILLION in a
 * million). Frames keep their order; a full queue drops, as a link would.
 *
 *   wire TAP_A TAP_B DELAY_US LOSS_PER_MILLION
 *
 * The devices must exist (ip tuntap add dev NAME mode tap). Runs until
 * killed; on SIGTERM prints how many frames it forwarded and dropped.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define QUEUE 8192  /* frames in flight per direction */
#define FRAME 2048  /* bytes per slot: MTU 1500 frames fit */

typedef struct frame {
    int64_t due_ns;
    int len;
    unsigned char data[FRAME];
} frame_t;

typedef struct direction {
    int in, out;
    frame_t *q;
    unsigned head, tail; /* q[head % QUEUE] is the oldest */
    unsigned long long forwarded, dropped;
} direction_t;

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int open_tap(const char *name)
{
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK);
    if (fd < 0) {
        perror("wire: /dev/net/tun");
        exit(1);
    }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
        fprintf(stderr, "wire: attaching to %s: %s\n", name, strerror(errno));
        exit(1);
    }
    return fd;
}

/* Reads every frame waiting on d->in into the queue (or drops it). */
static void take(direction_t *d, int64_t delay_ns, long loss)
{
    for (;;) {
        unsigned char scratch[FRAME];
        bool full = d->tail - d->head >= QUEUE;
        frame_t *f = &d->q[d->tail % QUEUE];
        ssize_t n = read(d->in, full ? scratch : f->data, FRAME);
        if (n <= 0) return;
        if (full || (loss > 0 && random() % 1000000 < loss)) {
            d->dropped++;
            continue;
        }
        f->len = (int)n;
        f->due_ns = now_ns() + delay_ns;
        d->tail++;
    }
}

/* Writes the frames whose time has come; returns ns until the next one (-1: none). */
static int64_t give(direction_t *d)
{
    int64_t now = now_ns();
    while (d->head != d->tail) {
        frame_t *f = &d->q[d->head % QUEUE];
        if (f->due_ns > now) return f->due_ns - now;
        if (write(d->out, f->data, (size_t)f->len) < 0 && errno == EAGAIN) return 20000;
        d->head++;
        d->forwarded++;
    }
    return -1;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: wire TAP_A TAP_B DELAY_US LOSS_PER_MILLION\n");
        return 2;
    }
    int64_t delay_ns = atoll(argv[3]) * 1000;
    long loss = atol(argv[4]);
    int a = open_tap(argv[1]), b = open_tap(argv[2]);
    direction_t dirs[2] = {{.in = a, .out = b}, {.in = b, .out = a}};
    for (int i = 0; i < 2; i++) {
        dirs[i].q = malloc(sizeof(frame_t) * QUEUE);
        if (!dirs[i].q) {
            fprintf(stderr, "wire: out of memory\n");
            return 1;
        }
    }
    srandom((unsigned)getpid());
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    while (!stop) {
        int64_t wait = -1;
        for (int i = 0; i < 2; i++) {
            int64_t w = give(&dirs[i]);
            if (w >= 0 && (wait < 0 || w < wait)) wait = w;
        }
        struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
        if (wait < 0) wait = 100 * 1000000LL;
        struct timespec ts = {wait / 1000000000, wait % 1000000000};
        if (ppoll(p, 2, &ts, NULL) < 0 && errno != EINTR) break;
        if (p[0].revents & POLLIN) take(&dirs[0], delay_ns, loss);
        if (p[1].revents & POLLIN) take(&dirs[1], delay_ns, loss);
    }
    printf("wire: forwarded %llu + %llu frames, dropped %llu + %llu\n", dirs[0].forwarded,
           dirs[1].forwarded, dirs[0].dropped, dirs[1].dropped);
    return 0;
}
