/*
 * The raw TCP baseline of bench/bench_client.py: moves the same bytes a batchwire client
 * fetches over one loopback TCP connection, with no framing and no protocol, and reports the
 * rate.
 *
 *     bench_client_tcp FILE OFFSET BYTES CHUNK REPEAT
 *
 * A sender thread maps FILE and writes bytes [OFFSET, OFFSET + BYTES) REPEAT times, CHUNK
 * bytes per write(); the main thread reads into one reusable CHUNK-byte buffer (as a client
 * fills a reusable batch buffer) until every byte has arrived. Prints one JSON line:
 * {"bytes":N,"seconds":S,"mib_per_s":M}. Timing starts before the connection is accepted.
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

typedef struct sender {
    const uint8_t *data;
    uint64_t bytes, chunk, repeat;
    uint16_t port;
    int rc;
} sender;

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
            uint64_t done = 0;
            while (done < n) {
                ssize_t w = write(fd, s->data + off + done, (size_t)(n - done));
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

int main(int argc, char **argv)
{
    uint64_t offset, bytes, chunk, repeat;
    if (argc != 6 || parse_u64(argv[2], &offset) || parse_u64(argv[3], &bytes) ||
        parse_u64(argv[4], &chunk) || parse_u64(argv[5], &repeat) || chunk == 0) {
        fprintf(stderr, "usage: bench_client_tcp FILE OFFSET BYTES CHUNK REPEAT\n");
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
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &alen) != 0) {
        perror("bench_client_tcp: listen");
        return 1;
    }
    uint8_t *buf = malloc((size_t)chunk);
    if (!buf)
        return 1;
    memset(buf, 0, (size_t)chunk);
    sender s = {map + offset, bytes, chunk, repeat, ntohs(a.sin_port), 0};
    double t0 = now_s();
    pthread_t th;
    if (pthread_create(&th, NULL, send_main, &s) != 0)
        return 1;
    int cs = accept(ls, NULL, NULL);
    if (cs < 0) {
        perror("bench_client_tcp: accept");
        return 1;
    }
    uint64_t total = bytes * repeat, got = 0, fill = 0;
    volatile uint8_t sink = 0;
    while (got < total) {
        ssize_t r = read(cs, buf + fill, (size_t)(chunk - fill));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            fprintf(stderr, "bench_client_tcp: read: connection ended after %" PRIu64 " bytes\n",
                    got);
            return 1;
        }
        got += (uint64_t)r;
        fill += (uint64_t)r;
        if (fill == chunk || got == total) {
            sink ^= buf[0]; /* a batch is complete: the consumer looks at it */
            fill = 0;
        }
    }
    double secs = now_s() - t0;
    pthread_join(th, NULL);
    close(cs);
    close(ls);
    free(buf);
    munmap(map, (size_t)st.st_size);
    (void)sink;
    printf("{\"bytes\":%" PRIu64 ",\"seconds\":%.6f,\"mib_per_s\":%.1f}\n", total, secs,
           secs > 0 ? (double)total / (1 << 20) / secs : 0.0);
    return s.rc;
}
