/*
 * The raw TCP baseline of bench/bench_client.py: moves the same bytes a batchwire client
 * fetches over CONNS loopback TCP connections (default 1), with no framing and no protocol,
 * and reports the rate.
 *
 *     bench_client_tcp FILE OFFSET BYTES CHUNK REPEAT [CONNS]
 *
 * FILE is mapped and bytes [OFFSET, OFFSET + BYTES) are sent REPEAT times as batches of CHUNK
 * bytes. With CONNS connections, sender thread i writes part i of every batch (CONNS equal
 * parts, one write() each) and receiver thread i reads it into its part of one reusable
 * CHUNK-byte buffer (as a client fills a reusable batch buffer from several workers). Prints
 * one JSON line: {"bytes":N,"seconds":S,"mib_per_s":M}. Timing starts before the connections
 * are accepted and ends when every byte has arrived.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/version.h"

enum { MAX_CONNS = 16 };

typedef struct sender {
    const uint8_t *data;
    uint64_t bytes, chunk, repeat;
    uint16_t port;
    unsigned part, conns;
    int rc;
} sender;

/* Part `part` of CONNS of an n-byte batch: [*from, *to). */
static void part_of(uint64_t n, unsigned part, unsigned conns, uint64_t *from, uint64_t *to)
{
    *from = n * part / conns;
    *to = n * (part + 1) / conns;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno)
        return -1;
    *out = v;
    return 0;
}

static void *send_main(void *arg)
{
    sender *s = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons(s->port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        perror("bench_client_tcp: connect");
        s->rc = 1;
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    for (uint64_t r = 0; r < s->repeat && !s->rc; r++) {
        for (uint64_t off = 0; off < s->bytes && !s->rc;) {
            uint64_t n = s->bytes - off < s->chunk ? s->bytes - off : s->chunk;
            uint64_t from, to;
            part_of(n, s->part, s->conns, &from, &to);
            uint64_t done = from;
            while (done < to) {
                ssize_t w = write(fd, s->data + off + done, (size_t)(to - done));
                if (w < 0 && errno == EINTR)
                    continue;
                if (w <= 0) {
                    perror("bench_client_tcp: write");
                    s->rc = 1;
                    break;
                }
                done += (uint64_t)w;
            }
            off += n;
        }
    }
    close(fd);
    return NULL;
}

typedef struct receiver {
    int fd;
    uint8_t *buf; /* the whole batch buffer; this receiver fills its part */
    uint64_t bytes, chunk, repeat;
    unsigned part, conns;
    int rc;
} receiver;

static void *recv_main(void *arg)
{
    receiver *r = arg;
    volatile uint8_t sink = 0;
    for (uint64_t rep = 0; rep < r->repeat && !r->rc; rep++)
        for (uint64_t off = 0; off < r->bytes && !r->rc;) {
            uint64_t n = r->bytes - off < r->chunk ? r->bytes - off : r->chunk;
            uint64_t from, to;
            part_of(n, r->part, r->conns, &from, &to);
            while (from < to) {
                ssize_t got = read(r->fd, r->buf + from, (size_t)(to - from));
                if (got < 0 && errno == EINTR)
                    continue;
                if (got <= 0) {
                    fprintf(stderr, "bench_client_tcp: read: connection ended early\n");
                    r->rc = 1;
                    break;
                }
                from += (uint64_t)got;
            }
            sink ^= r->buf[0]; /* a batch part is complete: the consumer looks at it */
            off += n;
        }
    (void)sink;
    return NULL;
}

int main(int argc, char **argv)
{
    if (bw__version_flag(argc, argv, "bench_client_tcp"))
        return 0;
    uint64_t offset, bytes, chunk, repeat;
    uint64_t conns = 1;
    if ((argc != 6 && argc != 7) || parse_u64(argv[2], &offset) || parse_u64(argv[3], &bytes) ||
        parse_u64(argv[4], &chunk) || parse_u64(argv[5], &repeat) || chunk == 0 ||
        (argc == 7 && (parse_u64(argv[6], &conns) || conns < 1 || conns > MAX_CONNS))) {
        fprintf(stderr, "usage: bench_client_tcp FILE OFFSET BYTES CHUNK REPEAT [CONNS 1-%d]\n",
                MAX_CONNS);
        return 2;
    }
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || offset + bytes > (uint64_t)st.st_size) {
        fprintf(stderr, "bench_client_tcp: %s: cannot read %" PRIu64 " bytes at %" PRIu64 "\n",
                argv[1], bytes, offset);
        return 1;
    }
    uint8_t *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        perror("bench_client_tcp: mmap");
        return 1;
    }
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof(a);
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, MAX_CONNS) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &alen) != 0) {
        perror("bench_client_tcp: listen");
        return 1;
    }
    uint8_t *buf = malloc((size_t)chunk);
    if (!buf)
        return 1;
    memset(buf, 0, (size_t)chunk);
    sender s[MAX_CONNS];
    receiver rv[MAX_CONNS];
    pthread_t sth[MAX_CONNS], rth[MAX_CONNS];
    double t0 = now_s();
    for (unsigned i = 0; i < conns; i++) {
        s[i] =
            (sender){map + offset, bytes, chunk, repeat, ntohs(a.sin_port), i, (unsigned)conns, 0};
        if (pthread_create(&sth[i], NULL, send_main, &s[i]) != 0)
            return 1;
    }
    for (unsigned i = 0; i < conns; i++) {
        int cs = accept(ls, NULL, NULL);
        if (cs < 0) {
            perror("bench_client_tcp: accept");
            return 1;
        }
        rv[i] = (receiver){cs, buf, bytes, chunk, repeat, i, (unsigned)conns, 0};
        if (pthread_create(&rth[i], NULL, recv_main, &rv[i]) != 0)
            return 1;
    }
    int rc = 0;
    for (unsigned i = 0; i < conns; i++) {
        pthread_join(rth[i], NULL);
        rc |= rv[i].rc;
    }
    double secs = now_s() - t0;
    uint64_t total = bytes * repeat;
    for (unsigned i = 0; i < conns; i++) {
        pthread_join(sth[i], NULL);
        rc |= s[i].rc;
        close(rv[i].fd);
    }
    close(ls);
    free(buf);
    munmap(map, (size_t)st.st_size);
    printf("{\"bytes\":%" PRIu64 ",\"seconds\":%.6f,\"mib_per_s\":%.1f}\n", total, secs,
           secs > 0 ? (double)total / (1 << 20) / secs : 0.0);
    return rc;
}
