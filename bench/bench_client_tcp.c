/*
 * The raw TCP baseline of bench/bench_client.py: moves the same bytes a batchwire client
 * fetches over CONNS loopback TCP connections (default 1), with no framing and no protocol,
 * and reports the rate.
 *
 *     bench_client_tcp [--buffers N] [--placement SHARDS [--check]] [--copy-below BYTES]
 *                      FILE OFFSET BYTES CHUNK REPEAT [CONNS [ORDER|- SAMPLE]]
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
 *
 * With --placement SHARDS (and ORDER, or "-" for the range's own order, and SAMPLE), each
 * batch is split as the fetch splits it over CONNS workers with ids w0, w1, ... (bench_client.py
 * names its workers so): sample i goes over connection owner(shard(i)), the rendezvous owner
 * of its storage shard -- that of its block of neighbouring samples, the loader's block for
 * FILE as the dataset (bw__placement_block of the range's samples and the file's size), modulo
 * SHARDS (core/placement, BW_SHARD_MODULO -- the loader routes by 256 shards). The sender gathers
 * its samples of the batch with writev, neighbours in the file as one piece; the receiver scatters
 * them into their places in the batch with readv, neighbours in the batch as one piece, into batch
 * buffers of its own -- what the fetch's two ends do with a worker's samples, without the protocol
 * (docs/performance.md, "Per-sample cost, eleventh pass"). --check compares every sample received
 * so with the file. --copy-below BYTES copies the pieces smaller than BYTES into a send buffer
 * first and sends them from there as one piece (the workers do so below 1 KiB: many small pieces
 * cost the kernel more than the copy). A run that fails prints no rate.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
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
#include "placement/placement.h"

enum { MAX_CONNS = 16, IOV_BATCH = 1024 };

/* --placement: which connection carries each storage shard's samples. */
typedef struct split {
    uint32_t shards; /* 0: no split by placement (parts by position) */
    uint32_t block;  /* neighbouring samples placed together, as the loader places them */
    uint8_t owner[4096];
} split;

typedef struct sender {
    const uint8_t *data;
    const uint64_t *order; /* NULL: in file order; else the samples of SAMPLE bytes to send */
    const split *split;
    uint64_t sample;
    uint64_t bytes, chunk, repeat;
    uint16_t port;
    unsigned part, conns;
    int rc;
    uint64_t copy_below; /* --copy-below: smaller pieces are copied into `stage` and sent from it */
    uint8_t *stage;      /* CHUNK bytes, with copy_below */
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

/* Moves all of iov[0..n) over fd: writev (out) or readv, again after a partial one. */
static int move_all(int fd, struct iovec *iov, size_t n, bool out)
{
    for (size_t i = 0; i < n;) {
        ssize_t w = out ? writev(fd, iov + i, (int)(n - i)) : readv(fd, iov + i, (int)(n - i));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (out)
                perror("bench_client_tcp: writev");
            else
                fprintf(stderr, "bench_client_tcp: readv: connection ended early\n");
            return 1;
        }
        for (size_t left = (size_t)w; left && i < n;) { /* skip what was moved */
            size_t take = left < iov[i].iov_len ? left : iov[i].iov_len;
            iov[i].iov_base = (uint8_t *)iov[i].iov_base + take;
            iov[i].iov_len -= take;
            left -= take;
            if (!iov[i].iov_len)
                i++;
        }
    }
    return 0;
}

/* Adds [p, p + len) to iov[0..*n), as part of the last piece when it follows it. */
static void add_piece(struct iovec *iov, size_t *n, uint8_t *p, size_t len)
{
    if (*n && (uint8_t *)iov[*n - 1].iov_base + iov[*n - 1].iov_len == p)
        iov[*n - 1].iov_len += len;
    else
        iov[(*n)++] = (struct iovec){p, len};
}

/* The sample at place k of the sent sequence: order[k], or k itself in the range's order. */
static uint64_t sample_at(const uint64_t *order, uint64_t k)
{
    return order ? order[k] : k;
}

/* Whether connection `part` carries sample i (always, without a split by placement). */
static bool carries(const split *sp, unsigned part, uint64_t i)
{
    return !sp->shards ||
           sp->owner[bw__placement_shard(i, sp->block, sp->shards, BW_SHARD_MODULO)] == part;
}

/* Copies the pieces of iov[0..n) under `below` bytes into stage, in order, neighbours there
 * forming one piece, and returns how many pieces are left (the larger ones sent from where
 * they are). The pieces fit: at most a batch of bytes, and stage holds one. */
static size_t stage_pieces(struct iovec *iov, size_t n, uint8_t *stage, uint64_t below)
{
    size_t m = 0, used = 0;
    for (size_t i = 0; i < n; i++) {
        struct iovec v = iov[i];
        if (v.iov_len < below) {
            memcpy(stage + used, v.iov_base, v.iov_len);
            v.iov_base = stage + used;
            used += v.iov_len;
        }
        add_piece(iov, &m, v.iov_base, v.iov_len); /* m <= i: iov[i] is read first */
    }
    return m;
}

/* Writes the samples at places [from, to) of the sequence that this sender carries, each
 * from its place in the mapping, IOV_BATCH pieces at a time. */
static int write_samples(int fd, const sender *s, uint64_t from, uint64_t to)
{
    struct iovec iov[IOV_BATCH];
    while (from < to) {
        size_t n = 0;
        for (; from < to && (n < IOV_BATCH - 1 || n == 0); from++) {
            uint64_t i = sample_at(s->order, from);
            if (carries(s->split, s->part, i))
                add_piece(iov, &n, (uint8_t *)(s->data + i * s->sample), (size_t)s->sample);
        }
        if (s->copy_below) /* small pieces copied together: one piece for the lot */
            n = stage_pieces(iov, n, s->stage, s->copy_below);
        if (move_all(fd, iov, n, true))
            return 1;
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
    /* which part this connection carries: connections are accepted in any order */
    uint8_t part = (uint8_t)s->part;
    if (write(fd, &part, 1) != 1) {
        perror("bench_client_tcp: write");
        s->rc = 1;
    }
    if (s->copy_below && !(s->stage = malloc((size_t)s->chunk))) {
        fprintf(stderr, "bench_client_tcp: cannot allocate a send buffer of %" PRIu64 " bytes\n",
                s->chunk);
        s->rc = 1;
    }
    for (uint64_t r = 0; r < s->repeat && !s->rc; r++) {
        for (uint64_t off = 0; off < s->bytes && !s->rc;) {
            uint64_t n = s->bytes - off < s->chunk ? s->bytes - off : s->chunk;
            uint64_t from, to;
            if (s->order || s->split->shards ||
                s->copy_below) { /* this part's whole samples, from their places */
                uint64_t first = ((s->order ? r * s->bytes : 0) + off) / s->sample;
                if (s->split->shards) { /* the batch's samples its shards' owner holds */
                    from = 0;
                    to = n / s->sample;
                } else {
                    part_of(n / s->sample, s->part, s->conns, &from, &to);
                }
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
    free(s->stage);
    return NULL;
}

typedef struct receiver {
    int fd;
    uint8_t *buf; /* the batch buffers (nbufs of CHUNK bytes); this receiver fills its part */
    const uint64_t *order; /* with a split by placement: which sample each place holds */
    const split *split;
    const uint8_t *check; /* --check (with --placement): the range, to compare samples with */
    uint64_t nbufs;
    uint64_t sample; /* with an order: parts are whole samples */
    uint64_t bytes, chunk, repeat;
    unsigned part, conns;
    int rc;
} receiver;

/* Reads the samples this receiver's connection carries of the batch of `count` samples whose
 * first is place `first` of the sequence, each into its place in buf, IOV_BATCH pieces at a
 * time. */
static int read_places(const receiver *r, uint8_t *buf, uint64_t first, uint64_t count)
{
    struct iovec iov[IOV_BATCH];
    for (uint64_t k = 0; k < count;) {
        size_t n = 0;
        for (; k < count && (n < IOV_BATCH - 1 || n == 0); k++)
            if (carries(r->split, r->part, sample_at(r->order, first + k)))
                add_piece(iov, &n, buf + k * r->sample, (size_t)r->sample);
        if (move_all(r->fd, iov, n, false))
            return 1;
    }
    for (uint64_t k = 0; r->check && k < count; k++) {
        uint64_t i = sample_at(r->order, first + k);
        if (carries(r->split, r->part, i) &&
            memcmp(buf + k * r->sample, r->check + i * r->sample, (size_t)r->sample) != 0) {
            fprintf(stderr,
                    "bench_client_tcp: --check: place %" PRIu64 " of batch at %" PRIu64
                    " is not sample %" PRIu64 "\n",
                    k, first, i);
            return 1;
        }
    }
    return 0;
}

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
            if (r->split->shards) { /* the places of the samples this connection carries */
                r->rc = read_places(r, buf, ((r->order ? rep * r->bytes : 0) + off) / r->sample,
                                    n / r->sample);
                sink ^= buf[0];
                off += n;
                continue;
            }
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
    uint64_t conns = 1, sample = 1, nbufs = 1, shards = 0, copy_below = 0;
    bool check = false;
    static split sp; /* zero: parts by position */
    /* options, in any order, before FILE */
    while (argc > 1 && strncmp(argv[1], "--", 2) == 0) {
        const char *opt = argv[1], *val = argc > 2 ? argv[2] : "";
        if (strcmp(opt, "--check") == 0) {
            check = true;
            argv++;
            argc--;
            continue;
        }
        if (strcmp(opt, "--buffers") == 0) {
            if (parse_u64(val, &nbufs) || nbufs < 1 || nbufs > 64) {
                fprintf(stderr, "bench_client_tcp: --buffers %s: expected 1 to 64\n", val);
                return 2;
            }
        } else if (strcmp(opt, "--placement") == 0) {
            if (parse_u64(val, &shards) || shards < 1 || shards > sizeof(sp.owner)) {
                fprintf(stderr, "bench_client_tcp: --placement %s: expected 1 to %zu shards\n", val,
                        sizeof(sp.owner));
                return 2;
            }
        } else if (strcmp(opt, "--copy-below") == 0) {
            if (parse_u64(val, &copy_below) || copy_below > (1u << 20)) {
                fprintf(stderr, "bench_client_tcp: --copy-below %s: expected 0 to 1048576 bytes\n",
                        val);
                return 2;
            }
        } else {
            fprintf(stderr, "bench_client_tcp: unknown option %s\n", opt);
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
                "usage: bench_client_tcp [--buffers N] [--placement SHARDS [--check]] "
                "[--copy-below BYTES] FILE OFFSET BYTES CHUNK REPEAT [CONNS 1-%d [ORDER|- "
                "SAMPLE]]\n(with ORDER, BYTES and CHUNK are multiples of SAMPLE; --placement and "
                "--copy-below need ORDER or -)\n",
                MAX_CONNS);
        return 2;
    }
    if (check && !shards) {
        fprintf(stderr, "bench_client_tcp: --check compares what --placement splits: give both\n");
        return 2;
    }
    if ((shards || copy_below) && argc != 9) {
        fprintf(stderr, "bench_client_tcp: --placement and --copy-below work on whole samples: "
                        "give ORDER (or -) and SAMPLE\n");
        return 2;
    }
    if (shards) { /* shard k's owner among workers w0 .. w<CONNS-1> (core/placement) */
        char names[MAX_CONNS][16];
        const char *ids[MAX_CONNS];
        for (unsigned i = 0; i < conns; i++) {
            snprintf(names[i], sizeof(names[i]), "w%u", i);
            ids[i] = names[i];
        }
        sp.shards = (uint32_t)shards;
        for (uint32_t k = 0; k < sp.shards; k++)
            sp.owner[k] = (uint8_t)bw__placement_owner(ids, (size_t)conns, k);
    }
    uint64_t *order = NULL;
    if (argc == 9 && strcmp(argv[7], "-") != 0) {
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
    if (sp.shards)
        sp.block = bw__placement_block(bytes / sample, (uint64_t)st.st_size, sp.shards);
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
    /* With a split by placement each receiver fills buffers of its own: a place belongs to
     * another connection from one batch to the next, and receivers that shared a buffer would
     * write the next batch's places into one the other still fills (a fetch's batch is whole
     * before its slot is filled again; a barrier a batch would cost the baseline a hand-off per
     * batch, which the fetch spreads over a group of batches). Each writes only its places, so
     * the same cache lines are written as with one shared buffer. */
    uint64_t sets = sp.shards ? conns : 1;
    nbufs *= sets;
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
        s[i] = (sender){.data = map + offset,
                        .order = order,
                        .split = &sp,
                        .sample = sample,
                        .bytes = bytes,
                        .chunk = chunk,
                        .repeat = repeat,
                        .port = ntohs(a.sin_port),
                        .part = i,
                        .conns = (unsigned)conns,
                        .copy_below = copy_below};
        if (pthread_create(&sth[i], NULL, send_main, &s[i]) != 0)
            return 1;
    }
    bool seen[MAX_CONNS] = {false};
    for (unsigned k = 0; k < conns; k++) {
        int cs = accept(ls, NULL, NULL);
        uint8_t part = 0;
        if (cs < 0 || read(cs, &part, 1) != 1 || part >= conns || seen[part]) {
            fprintf(stderr, "bench_client_tcp: connection %u: no part number, or a wrong one\n", k);
            return 1;
        }
        seen[part] = true;
        unsigned i = part; /* the receiver of the part its sender carries */
        rv[i] = (receiver){.fd = cs,
                           .buf = buf + (sets > 1 ? i * (nbufs / sets) * chunk : 0),
                           .order = order,
                           .split = &sp,
                           .nbufs = nbufs / sets,
                           .sample = sample,
                           .bytes = bytes,
                           .chunk = chunk,
                           .repeat = repeat,
                           .part = i,
                           .conns = (unsigned)conns,
                           .check = check ? map + offset : NULL};
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
    if (rc == 0) /* a failed run has no rate */
        printf("{\"bytes\":%" PRIu64 ",\"seconds\":%.6f,\"mib_per_s\":%.1f}\n", total, secs,
               secs > 0 ? (double)total / (1 << 20) / secs : 0.0);
    return rc;
}
