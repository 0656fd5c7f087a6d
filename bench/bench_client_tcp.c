/*
 * The raw TCP baseline of bench/bench_client.py: moves the same bytes a batchwire client
 * fetches over CONNS loopback TCP connections (default 1), with no framing and no protocol,
 * and reports the rate.
 *
 *     bench_client_tcp [--buffers N] FILE OFFSET BYTES CHUNK REPEAT [CONNS [ORDER SAMPLE]]
 *
 * FILE is mapped and bytes [OFFSET, OFFSET + BYTES) are sent REPEAT times as batches of CHUNK
 * bytes. With CONNS connections, sender thread i writes part i of every batch (CONNS equal
 * parts, one write() each) and receiver thread i reads it into its part of one reusable
 * CHUNK-byte buffer (as a client fills a reusable batch buffer from several workers). With
 * --buffers N (default 1), batch k is read into buffer k mod N of N such buffers: N = 2 is
 * the least a loader can have that hands the trainer one batch while the next arrives, and a
 * single buffer, written again and again, stays in the processor's cache where N of them may
 * not (docs/performance.md, "Per-sample cost, seventh pass"). Prints one JSON line:
 * {"bytes":N,"seconds":S,"mib_per_s":M}. Timing starts before the connections are accepted
 * and ends when every byte has arrived.
 *
 * With ORDER and SAMPLE, the range holds samples of SAMPLE bytes (CHUNK a multiple of it) and
 * they are sent in the order ORDER gives -- a file of REPEAT * BYTES / SAMPLE sample numbers,
 * u64 little-endian, e.g. a shuffled epoch's batches one after the other (bench_client.py
 * writes them from `batchwire plan --shuffle`): each batch's samples are read from their
 * places in the mapping, sender i writing part i of them (whole samples) with one writev of
 * up to IOV_MAX pieces at a time, so the baseline reads the same random offsets a shuffled
 * fetch reads.
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
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/version.h"

enum { MAX_CONNS = 16 };

typedef struct sender {
    const uint8_t *data;
    const uint64_t *order; /* NULL: in file order; else the samples of SAMPLE bytes to send */
    uint64_t sample;
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

/* Writes samples order[from, to) of SAMPLE bytes each from the mapping, IOV_MAX at a time. */
static int write_samples(int fd, const sender *s, uint64_t from, uint64_t to)
{
    enum { IOV_BATCH = 1024 };
    struct iovec iov[IOV_BATCH];
    while (from < to) {
        size_t n = 0;
        for (; n < IOV_BATCH && from + n < to; n++)
            iov[n] = (struct iovec){(void *)(s->data + s->order[from + n] * s->sample),
                                    (size_t)s->sample};
        from += n;
        for (size_t i = 0; i < n;) {
            ssize_t w = writev(fd, iov + i, (int)(n - i));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                perror("bench_client_tcp: writev");
                return 1;
            }
            for (size_t left = (size_t)w; left && i < n;) { /* skip what was written */
                size_t take = left < iov[i].iov_len ? left : iov[i].iov_len;
                iov[i].iov_base = (uint8_t *)iov[i].iov_base + take;
                iov[i].iov_len -= take;
                left -= take;
                if (!iov[i].iov_len)
                    i++;
            }
        }
    }
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
            if (s->order) { /* this part's whole samples, from where the order puts them */
                uint64_t first = (r * s->bytes + off) / s->sample;
                part_of(n / s->sample, s->part, s->conns, &from, &to);
                s->rc = write_samples(fd, s, first + from, first + to);
                off += n;
                continue;
            }
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
    uint8_t *buf; /* the batch buffers (nbufs of CHUNK bytes); this receiver fills its part */
    uint64_t nbufs;
    uint64_t sample; /* with an order: parts are whole samples */
    uint64_t bytes, chunk, repeat;
    unsigned part, conns;
    int rc;
} receiver;

static void *recv_main(void *arg)
{
    receiver *r = arg;
    volatile uint8_t sink = 0;
    uint64_t batch = 0; /* batches received: batch k goes into buffer k mod nbufs */
    for (uint64_t rep = 0; rep < r->repeat && !r->rc; rep++)
        for (uint64_t off = 0; off < r->bytes && !r->rc; batch++) {
            uint64_t n = r->bytes - off < r->chunk ? r->bytes - off : r->chunk;
            uint64_t from, to;
            uint8_t *buf = r->buf + batch % r->nbufs * r->chunk;
            part_of(n / r->sample, r->part, r->conns, &from, &to);
            from *= r->sample;
            to *= r->sample;
            while (from < to) {
                ssize_t got = read(r->fd, buf + from, (size_t)(to - from));
                if (got < 0 && errno == EINTR)
                    continue;
                if (got <= 0) {
                    fprintf(stderr, "bench_client_tcp: read: connection ended early\n");
                    r->rc = 1;
                    break;
                }
                from += (uint64_t)got;
            }
            sink ^= buf[0]; /* a batch part is complete: the consumer looks at it */
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
    uint64_t conns = 1, sample = 1, nbufs = 1;
    if (argc > 2 && strcmp(argv[1], "--buffers") == 0) {
        if (parse_u64(argv[2], &nbufs) || nbufs < 1 || nbufs > 64) {
            fprintf(stderr, "bench_client_tcp: --buffers %s: expected 1 to 64\n", argv[2]);
            return 2;
        }
        argv += 2;
        argc -= 2;
    }
    if ((argc != 6 && argc != 7 && argc != 9) || parse_u64(argv[2], &offset) ||
        parse_u64(argv[3], &bytes) || parse_u64(argv[4], &chunk) || parse_u64(argv[5], &repeat) ||
        chunk == 0 ||
        (argc >= 7 && (parse_u64(argv[6], &conns) || conns < 1 || conns > MAX_CONNS)) ||
        (argc == 9 &&
         (parse_u64(argv[8], &sample) || sample == 0 || chunk % sample || bytes % sample))) {
        fprintf(stderr,
                "usage: bench_client_tcp [--buffers N] FILE OFFSET BYTES CHUNK REPEAT [CONNS 1-%d "
                "[ORDER "
                "SAMPLE]]\n(with ORDER, BYTES and CHUNK are multiples of SAMPLE)\n",
                MAX_CONNS);
        return 2;
    }
    uint64_t *order = NULL;
    if (argc == 9) {
        uint64_t want = repeat * (bytes / sample);
        FILE *f = fopen(argv[7], "rb");
        order = malloc((size_t)(want ? want : 1) * sizeof(*order));
        size_t got = f && order ? fread(order, sizeof(*order), (size_t)want, f) : 0;
        int extra = f ? fgetc(f) : EOF;
        if (f)
            fclose(f);
        if (got != want || extra != EOF) {
            fprintf(stderr,
                    "bench_client_tcp: %s: expected %" PRIu64 " sample numbers (u64) and nothing "
                    "more, read %zu\n",
                    argv[7], want, got);
            return 1;
        }
        for (uint64_t i = 0; i < want; i++) /* read in host order: bench_client.py writes "<Q" */
            if (order[i] >= bytes / sample) {
                fprintf(stderr,
                        "bench_client_tcp: %s: sample %" PRIu64 " at %" PRIu64
                        " is past the %" PRIu64 " samples of the range\n",
                        argv[7], order[i], i, bytes / sample);
                return 1;
            }
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
    if (chunk > SIZE_MAX / nbufs) {
        fprintf(stderr, "bench_client_tcp: %" PRIu64 " buffers of %" PRIu64 " bytes: too many\n",
                nbufs, chunk);
        return 2;
    }
    uint8_t *buf = malloc((size_t)(chunk * nbufs));
    if (!buf) {
        fprintf(stderr,
                "bench_client_tcp: cannot allocate %" PRIu64 " batch buffer(s) of %" PRIu64
                " bytes (CHUNK)\n",
                nbufs, chunk);
        return 1;
    }
    memset(buf, 0, (size_t)(chunk * nbufs)); /* faulted in before the clock starts */
    sender s[MAX_CONNS];
    receiver rv[MAX_CONNS];
    pthread_t sth[MAX_CONNS], rth[MAX_CONNS];
    double t0 = now_s();
    for (unsigned i = 0; i < conns; i++) {
        s[i] = (sender){map + offset,      order, sample,          bytes, chunk, repeat,
                        ntohs(a.sin_port), i,     (unsigned)conns, 0};
        if (pthread_create(&sth[i], NULL, send_main, &s[i]) != 0)
            return 1;
    }
    for (unsigned i = 0; i < conns; i++) {
        int cs = accept(ls, NULL, NULL);
        if (cs < 0) {
            perror("bench_client_tcp: accept");
            return 1;
        }
        rv[i] = (receiver){cs, buf, nbufs, sample, bytes, chunk, repeat, i, (unsigned)conns, 0};
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
    free(order);
    munmap(map, (size_t)st.st_size);
    printf("{\"bytes\":%" PRIu64 ",\"seconds\":%.6f,\"mib_per_s\":%.1f}\n", total, secs,
           secs > 0 ? (double)total / (1 << 20) / secs : 0.0);
    return rc;
}
