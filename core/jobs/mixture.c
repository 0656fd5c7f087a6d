/*
 * Mixtures (mixture.h). Every rule here is written out in docs/semantics.md ("Mixtures")
 * precisely enough to be re-implemented from the text; tests/integration/test_mixture_plan.py
 * does so and compares. Keep the two in step.
 *
 * The interleave is a balanced binary tree over the sources; each internal node merges its
 * two halves by jittered ideal times. Finding the source of a position walks down the tree,
 * asking at each node how many of the first p elements come from its left half: an estimate
 * p * A / M that the order never misses by a whole element (docs/semantics.md proves it),
 * corrected by at most two exact O(1) tests. Products reach 2^124: they are computed in
 * unsigned __int128.
 */
#include "jobs/mixture.h"

#include <inttypes.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "common/log.h"
#include "common/refuse.h"
#include "jobs/job_sampler.h"
#include "sampler/feistel.h"

typedef unsigned long long ull;
typedef unsigned __int128 u128;

#define GOLDEN 0x9e3779b97f4a7c15ull
#define TAG_PERMUTATION 1u
#define TAG_JITTER 2u
#define JITTER_BITS 32

/* One internal node of the interleave tree: sources [lo, hi), split at mid; A samples on the
 * left (side 0), B on the right (side 1). */
typedef struct node {
    uint64_t lo, mid, hi, A, B;
    uint64_t state; /* H(2, seed, epoch, lo, hi): the jitter hash before its last two words */
    uint64_t side_state[2]; /* H(2, seed, epoch, lo, hi, side): before its last word */
} node;

struct bw__mixture {
    size_t nsources;
    uint64_t samples, seed, epoch;
    uint64_t end; /* P */
    bw__mix_policy policy;
    bool *streams;         /* streams[j]: source j is a stream */
    uint64_t *sizes;       /* n_j */
    uint64_t *counts;      /* c_j */
    uint64_t *prefix;      /* prefix[j] = c_0 + ... + c_{j-1}; prefix[nsources] = E */
    uint64_t jitter_state; /* H(2, seed, epoch) */
    /* The tree's internal nodes, made once: the root is nodes[0], node i's children are
     * nodes[2i + 1] (left) and nodes[2i + 2] (right); a leaf has no entry. */
    node *nodes;
};

struct bw__mix_sampler {
    bw__mixture *mix;
    bw__sampler *positions;
};

int bw__mix_weight_parse(const char *text, uint64_t *units, char *err, size_t errlen)
{
    uint64_t whole = 0, frac = 0;
    int whole_digits = 0, frac_digits = 0;
    const char *c = text;
    for (; *c >= '0' && *c <= '9'; c++) {
        whole = whole * 10 + (uint64_t)(*c - '0');
        if (whole > BW__MIX_MAX_WEIGHT / BW__MIX_WEIGHT_UNIT)
            return bw__refuse(err, errlen, "weight '%s' is above the largest weight, 1000000000",
                              text);
        whole_digits++;
    }
    if (*c == '.') {
        for (c++; *c >= '0' && *c <= '9'; c++) {
            if (++frac_digits > 9)
                return bw__refuse(err, errlen, "weight '%s' has more than 9 digits after the point",
                                  text);
            frac = frac * 10 + (uint64_t)(*c - '0');
        }
    }
    if (*c != '\0' || whole_digits + frac_digits == 0)
        return bw__refuse(err, errlen,
                          "weight '%s' is not a decimal number (digits with at most one point, "
                          "e.g. 0.7 or 70)",
                          text);
    for (int i = frac_digits; i < 9; i++)
        frac *= 10;
    uint64_t value = whole * BW__MIX_WEIGHT_UNIT + frac;
    if (value == 0)
        return bw__refuse(err, errlen, "weight '%s' is not positive", text);
    if (value > BW__MIX_MAX_WEIGHT)
        return bw__refuse(err, errlen, "weight '%s' is above the largest weight, 1000000000", text);
    *units = value;
    return BW_OK;
}

void bw__mix_weight_format(uint64_t units, char *out, size_t outlen)
{
    uint64_t whole = units / BW__MIX_WEIGHT_UNIT, frac = units % BW__MIX_WEIGHT_UNIT;
    if (frac == 0) {
        snprintf(out, outlen, "%" PRIu64, whole);
        return;
    }
    int digits = 9;
    for (; frac % 10 == 0; frac /= 10)
        digits--;
    snprintf(out, outlen, "%" PRIu64 ".%0*" PRIu64, whole, digits, frac);
}

/* SplitMix64's output function applied to z + golden (docs/semantics.md, "The hash H"). */
static uint64_t mix64(uint64_t z)
{
    z += GOLDEN;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t hash(const uint64_t *words, size_t n)
{
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++)
        h = mix64(h ^ words[i]);
    return h;
}

/* The permutation of pass `pass` of source j's stream, of [0, n). */
static void permutation_init(bw__feistel *f, uint64_t seed, uint32_t source, uint64_t pass,
                             uint64_t n)
{
    const uint64_t words[] = {TAG_PERMUTATION, seed, source, pass};
    /* The domain 2^b (docs/semantics.md, "Within a source"): b the bits of n - 1, at least 1,
     * made even below 8 (a small domain of two equal parts spreads its permutations more
     * evenly). The round keys are mix64(key + r * golden), r = 0..5: the SplitMix64 sequence
     * from the key, as the doc states. */
    unsigned bits = n > 1 ? 64u - (unsigned)__builtin_clzll(n - 1) : 1;
    if (bits < 8)
        bits += bits & 1;
    bw__feistel_init_bits(f, n, bits, hash(words, 4));
}

uint64_t bw__mix_permute(uint64_t seed, uint32_t source, uint64_t pass, uint64_t n, uint64_t i)
{
    bw__feistel f;
    permutation_init(&f, seed, source, pass, n);
    return bw__feistel_at(&f, i);
}

/* Largest remainder: c_j = floor(E w_j / T) plus one for the E - sum(floor) sources whose
 * remainders E w_j mod T are largest, ties to the lower index. */
typedef struct remainder {
    u128 r;
    size_t j;
} remainder;

static int by_remainder(const void *a, const void *b)
{
    const remainder *x = a, *y = b;
    if (x->r != y->r)
        return x->r > y->r ? -1 : 1;
    return x->j < y->j ? -1 : (x->j > y->j);
}

/* E, or 0 after writing why the spec is refused. */
static uint64_t check_spec(const bw__mix_spec *spec, char *err, size_t errlen)
{
    if (spec->nsources == 0 || spec->nsources > BW__MIX_MAX_SOURCES) {
        bw__refuse(err, errlen, "a mixture has 1 to %d sources, not %zu", BW__MIX_MAX_SOURCES,
                   spec->nsources);
        return 0;
    }
    uint64_t sum = 0;
    for (size_t j = 0; j < spec->nsources; j++) {
        if (spec->sizes[j] == 0 || spec->sizes[j] > BW__MIX_MAX_SAMPLES) {
            bw__refuse(err, errlen, "source %zu has %llu samples; a source holds 1 to 2^62", j,
                       (ull)spec->sizes[j]);
            return 0;
        }
        if (spec->weights[j] == 0 || spec->weights[j] > BW__MIX_MAX_WEIGHT) {
            bw__refuse(err, errlen,
                       "source %zu has weight %llu x 10^-9; weights are positive and at most 10^9",
                       j, (ull)spec->weights[j]);
            return 0;
        }
        sum += spec->sizes[j]; /* each <= 2^62 and at most 256 of them: no wrap */
    }
    if (spec->policy != BW__MIX_CYCLE && spec->policy != BW__MIX_STOP) {
        bw__refuse(err, errlen, "mixture policy %d is not cycle (0) or stop (1)",
                   (int)spec->policy);
        return 0;
    }
    bool any_stream = false;
    for (size_t j = 0; spec->streams && j < spec->nsources; j++)
        any_stream |= spec->streams[j];
    if (spec->policy == BW__MIX_STOP && !any_stream) {
        bw__refuse(err, errlen,
                   "policy stop applies to stream sources and this mixture has none: a map-style "
                   "source never runs dry (each pass is a new permutation)");
        return 0;
    }
    uint64_t E = spec->samples ? spec->samples : sum; /* the sum is at least 1 */
    if (E > BW__MIX_MAX_SAMPLES) {
        bw__refuse(err, errlen,
                   spec->samples ? "the mixture's epoch size %llu is above 2^62"
                                 : "the sources' sizes sum to %llu, above 2^62: give the epoch's "
                                   "size explicitly",
                   (ull)E);
        return 0;
    }
    return E;
}

static int build_nodes(bw__mixture *m);

int bw__mixture_new(bw__mixture **out, const bw__mix_spec *spec, uint64_t seed, uint64_t epoch,
                    char *err, size_t errlen)
{
    *out = NULL;
    uint64_t E = check_spec(spec, err, errlen);
    if (E == 0)
        return BW_INVALID_ARGUMENT;
    if (epoch >= UINT64_MAX / E)
        return bw__refuse(
            err, errlen,
            "epoch %llu is too large for a mixture of %llu samples: (epoch + 1) x %llu "
            "must stay below 2^64 (epochs up to %llu)",
            (ull)epoch, (ull)E, (ull)E, (ull)(UINT64_MAX / E - 1));
    size_t S = spec->nsources;
    bw__mixture *m = calloc(1, sizeof(*m));
    remainder *rem = calloc(S, sizeof(*rem));
    if (m) {
        m->sizes = calloc(S, sizeof(*m->sizes));
        m->streams = calloc(S, sizeof(*m->streams));
        m->counts = calloc(S, sizeof(*m->counts));
        m->prefix = calloc(S + 1, sizeof(*m->prefix));
    }
    if (!m || !rem || !m->sizes || !m->streams || !m->counts || !m->prefix) {
        free(rem);
        bw__mixture_free(m);
        if (err && errlen)
            snprintf(err, errlen, "out of memory for a mixture of %zu sources", S);
        return BW_NOMEM;
    }
    m->nsources = S;
    m->samples = E;
    m->seed = seed;
    m->epoch = epoch;
    const uint64_t jitter_words[] = {TAG_JITTER, seed, epoch};
    m->jitter_state = hash(jitter_words, 3);
    memcpy(m->sizes, spec->sizes, S * sizeof(*m->sizes));
    if (spec->streams)
        memcpy(m->streams, spec->streams, S * sizeof(*m->streams));
    m->policy = spec->policy;
    u128 total = 0;
    for (size_t j = 0; j < S; j++)
        total += spec->weights[j];
    uint64_t given = 0;
    for (size_t j = 0; j < S; j++) {
        u128 share = (u128)E * spec->weights[j];
        m->counts[j] = (uint64_t)(share / total);
        given += m->counts[j];
        rem[j].r = share % total;
        rem[j].j = j;
    }
    qsort(rem, S, sizeof(*rem), by_remainder);
    /* sum floor(E w_j / T) > E - S, so fewer than S sources get one more */
    for (uint64_t i = 0; i < E - given; i++)
        m->counts[rem[i].j]++;
    free(rem);
    for (size_t j = 0; j < S; j++)
        m->prefix[j + 1] = m->prefix[j] + m->counts[j];
    if (S > 1 && build_nodes(m) != BW_OK) {
        bw__mixture_free(m);
        if (err && errlen)
            snprintf(err, errlen, "out of memory for a mixture of %zu sources", S);
        return BW_NOMEM;
    }
    /* Under stop the epoch ends before the first position that would need record n_j of a
     * stream: within a source positions grow with k, so that is the least of the positions
     * of the dry streams' k = n_j. */
    m->end = E;
    for (size_t j = 0; m->policy == BW__MIX_STOP && j < S; j++)
        if (m->streams[j] && m->counts[j] > m->sizes[j]) {
            uint64_t p = bw__mixture_position(m, (uint32_t)j, m->sizes[j]);
            if (p < m->end)
                m->end = p;
        }
    *out = m;
    return BW_OK;
}

void bw__mixture_free(bw__mixture *m)
{
    if (!m)
        return;
    free(m->sizes);
    free(m->streams);
    free(m->counts);
    free(m->prefix);
    free(m->nodes);
    free(m);
}

uint64_t bw__mixture_samples(const bw__mixture *m)
{
    return m->samples;
}

size_t bw__mixture_nsources(const bw__mixture *m)
{
    return m->nsources;
}

uint64_t bw__mixture_epoch(const bw__mixture *m)
{
    return m->epoch;
}

uint64_t bw__mixture_end(const bw__mixture *m)
{
    return m->end;
}

bool bw__mixture_is_stream(const bw__mixture *m, size_t source)
{
    return m->streams[source];
}

uint64_t bw__mixture_size(const bw__mixture *m, size_t source)
{
    return m->sizes[source];
}

uint64_t bw__mixture_count(const bw__mixture *m, size_t source)
{
    return m->counts[source];
}

static void node_at(node *n, const bw__mixture *m, uint64_t lo, uint64_t hi)
{
    n->lo = lo;
    n->mid = lo + (hi - lo) / 2;
    n->hi = hi;
    n->A = m->prefix[n->mid] - m->prefix[lo];
    n->B = m->prefix[hi] - m->prefix[n->mid];
    n->state = mix64(mix64(m->jitter_state ^ lo) ^ hi);
    n->side_state[0] = mix64(n->state ^ 0);
    n->side_state[1] = mix64(n->state ^ 1);
}

/* Node i covering [lo, hi) and, below it, its children. */
static void build_subtree(bw__mixture *m, size_t i, uint64_t lo, uint64_t hi)
{
    if (hi - lo < 2)
        return;
    node_at(&m->nodes[i], m, lo, hi);
    build_subtree(m, 2 * i + 1, lo, m->nodes[i].mid);
    build_subtree(m, 2 * i + 2, m->nodes[i].mid, hi);
}

static int build_nodes(bw__mixture *m)
{
    /* A node covering s sources has children of floor(s/2) and ceil(s/2): the tree is
     * ceil(log2 S) deep, so heap indices stay below 2^(depth + 1). */
    size_t depth = 0;
    while (((size_t)1 << depth) < m->nsources)
        depth++;
    m->nodes = calloc(((size_t)1 << (depth + 1)) - 1, sizeof(*m->nodes));
    if (!m->nodes)
        return BW_NOMEM;
    build_subtree(m, 0, 0, m->nsources);
    return BW_OK;
}

/* H(2, seed, epoch, lo, hi, side, k) >> 32, continuing the node's hash state. */
static uint64_t jitter(const node *n, uint64_t side, uint64_t k)
{
    return mix64(n->side_state[side] ^ k) >> (64 - JITTER_BITS);
}

/* floor(x / d) and x mod d for x < 2^128, d < 2^64; 64-bit division when x fits. */
static uint64_t divmod(u128 x, uint64_t d, uint64_t *rem)
{
    if (x >> 64 == 0) {
        *rem = (uint64_t)x % d;
        return (uint64_t)x / d;
    }
    *rem = (uint64_t)(x % d);
    return (uint64_t)(x / d);
}

/*
 * Where element k of side `side` (0 left, 1 right; that side not empty) sits in the node's
 * merged sequence: k plus the other side's elements that come before it. For the left side:
 * the right elements whose key (2^32 m + v_m) A is below left k's key X = (2^32 k + u_k) B.
 * With m0 = floor(X / (2^32 A)) and X = 2^32 A m0 + r2, every m < m0 is below, every m > m0
 * is not, and m0 is below when v_m0 A < r2. X reaches 2^156, so it is split: k B = q1 A + r1
 * gives X = 2^32 A q1 + y with y = 2^32 r1 + u_k B < 2^32 (A + B); then y = 2^32 yh + yl
 * (yl < 2^32) and yh = q2 A + r gives m0 = q1 + q2 and r2 = 2^32 r + yl. Every division is by
 * A. The right side is the same with A and B, u and v swapped, except that a left element
 * comes first on an equal key: m0 counts when u_m0 B <= r2.
 */
static uint64_t side_position(const node *n, uint64_t side, uint64_t k)
{
    uint64_t own = side ? n->B : n->A, other = side ? n->A : n->B;
    if (other == 0)
        return k;
    uint64_t r1, r, q1 = divmod((u128)k * other, own, &r1);
    u128 y = ((u128)r1 << JITTER_BITS) + (u128)jitter(n, side, k) * other;
    uint64_t q2 = divmod(y >> JITTER_BITS, own, &r);
    uint64_t m0 = q1 + q2;
    if (m0 >= other)
        return k + other;
    u128 r2 = ((u128)r << JITTER_BITS) | (uint64_t)(y & ((1ull << JITTER_BITS) - 1));
    u128 v = (u128)jitter(n, !side, m0) * own;
    return k + m0 + (side ? v <= r2 : v < r2);
}

static uint64_t left_position(const node *n, uint64_t k)
{
    return side_position(n, 0, k);
}

/*
 * A node's merge walked forward (bw__mixture_at_many): the positions of a batch's items at a
 * node mostly follow each other closely (consecutive in accelerate mode and at world size 1,
 * R apart in torch mode at R ranks), so the node keeps where the last one stood -- c left and
 * m right elements before position p, and the keys of left c and right m -- and reaches a
 * nearby later position by merging forward, a key comparison and a key per element, instead
 * of the O(1) but division-heavy random access.
 */
typedef struct key160 { /* a key (2^32 k + jitter) x F < 2^160, as top x 2^64 + low */
    u128 top;
    uint64_t low;
} key160;

typedef struct pos_memo {
    bool set, next_left; /* next_left: element p is a left one */
    uint64_t p;
    uint64_t before[2]; /* c left and m right elements before position p */
    key160 key[2];      /* the keys of left element c (if c < A) and right element m (if m < B) */
} pos_memo;

/* The furthest a walk (or a merged span) goes forward between two items; beyond, random
 * access. A merge step costs ~8 ns a position here and random access ~33 ns a level, so items
 * 8 apart (torch mode at world size 8) cost 52 ns a sample merged and 41 by random access
 * with 2 sources (docs/performance.md, "Planning ahead, and a cheaper split at each node"). */
enum { MEMO_STEPS = 4 };

/* The key of element k of side `side` (docs/semantics.md, "The global order"). */
static key160 node_key(const node *n, uint64_t side, uint64_t k)
{
    uint64_t f = side ? n->A : n->B;
    u128 lo_part = (u128)((k << JITTER_BITS) | jitter(n, side, k)) * f;
    key160 key = {(u128)(k >> (64 - JITTER_BITS)) * f + (lo_part >> 64), (uint64_t)lo_part};
    return key;
}

/* The keys of elements k0 .. k0 + count - 1 of a side as one number each, where they are
 * below 2^128 ((k + 1) F <= 2^96); one multiplication a key while k < 2^32. */
static void keys128(const node *n, uint64_t side, uint64_t k0, size_t count, u128 *out)
{
    uint64_t f = side ? n->A : n->B;
    if (k0 + count <= (1ull << (64 - JITTER_BITS))) {
        for (size_t i = 0; i < count; i++)
            out[i] = (u128)(((k0 + i) << JITTER_BITS) | jitter(n, side, k0 + i)) * f;
        return;
    }
    for (size_t i = 0; i < count; i++) {
        uint64_t k = k0 + i;
        out[i] = ((u128)(k >> (64 - JITTER_BITS)) * f << 64) +
                 (u128)((k << JITTER_BITS) | jitter(n, side, k)) * f;
    }
}

/* Whether left key l comes before right key r: keys ascending, a left key first on a tie
 * (l <= r). r - l does not go below zero: the tops are under 2^96, so their difference less
 * the low words' borrow fits a signed 128-bit number. */
static bool left_first(const key160 *l, const key160 *r)
{
    __int128 d = (__int128)(r->top - l->top) - (r->low < l->low);
    return d >= 0;
}

/* Whether the memo's next element (position p) is a left one. */
static bool memo_next_left(const node *n, const pos_memo *mm)
{
    if (mm->before[0] >= n->A)
        return false;
    if (mm->before[1] >= n->B)
        return true;
    return left_first(&mm->key[0], &mm->key[1]);
}

/*
 * Left elements among the node's first p elements (p <= A + B); *at_p tells whether element
 * p itself is a left one (then it is left element number the result). docs/semantics.md
 * proves the count within 1 of p A / (A + B), so it is floor(p A / (A + B)) or one more:
 * one or two O(1) tests.
 */
static uint64_t left_before_at(const node *n, uint64_t p, bool *at_p)
{
    *at_p = false;
    if (n->A == 0)
        return 0;
    u128 pa = (u128)p * n->A;
    uint64_t c = pa >> 64 ? (uint64_t)(pa / (n->A + n->B)) : (uint64_t)pa / (n->A + n->B);
    if (c < n->A) {
        uint64_t at = left_position(n, c);
        if (at < p && ++c < n->A)
            at = left_position(n, c);
        *at_p = c < n->A && at == p;
    }
#ifndef NDEBUG
    BW_INVARIANT(c == 0 || left_position(n, c - 1) < p, "a mixture's left count is not too high");
    BW_INVARIANT(c == n->A || left_position(n, c) >= p, "a mixture's left count is not too low");
#endif
    return c;
}

/* left_before_at, walking the memo's merge forward when p lies a few elements ahead of it. */
static uint64_t left_before(const node *n, pos_memo *mm, uint64_t p, bool *at_p)
{
    if (!mm->set || p < mm->p || p - mm->p > MEMO_STEPS) {
        uint64_t c = left_before_at(n, p, at_p);
        mm->p = p;
        mm->before[0] = c;
        mm->before[1] = p - c;
        for (uint64_t side = 0; side < 2; side++) {
            key160 none = {0, 0}; /* a side with no element left: never compared */
            mm->key[side] = mm->before[side] < (side ? n->B : n->A)
                                ? node_key(n, side, mm->before[side])
                                : none;
        }
        mm->next_left = *at_p;
        mm->set = true;
        return c;
    }
    for (; mm->p < p; mm->p++) { /* one merge step: the next element's side moves on */
        if (mm->next_left) {
            if (++mm->before[0] < n->A)
                mm->key[0] = node_key(n, 0, mm->before[0]);
        } else if (++mm->before[1] < n->B) {
            mm->key[1] = node_key(n, 1, mm->before[1]);
        }
        mm->next_left = memo_next_left(n, mm);
    }
    *at_p = mm->next_left;
#ifndef NDEBUG
    bool at_direct;
    BW_INVARIANT(left_before_at(n, p, &at_direct) == mm->before[0] && at_direct == *at_p,
                 "a mixture's merge walk agrees with its random access");
#endif
    return mm->before[0];
}

void bw__mixture_locate(const bw__mixture *m, uint64_t pos, uint32_t *source, uint64_t *k)
{
    uint64_t lo = 0, hi = m->nsources;
    for (size_t i = 0; hi - lo > 1;) {
        const node *n = &m->nodes[i];
        bool at;
        uint64_t left = left_before_at(n, pos, &at);
        if (at) {
            hi = n->mid;
            pos = left;
            i = 2 * i + 1;
        } else {
            lo = n->mid;
            pos -= left;
            i = 2 * i + 2;
        }
    }
    *source = (uint32_t)lo;
    *k = pos;
}

uint64_t bw__mixture_position(const bw__mixture *m, uint32_t source, uint64_t k)
{
    /* the path from the root to the leaf, then the leaf's k up through each node */
    const node *path[64];
    size_t depth = 0;
    uint64_t lo = 0, hi = m->nsources;
    for (size_t i = 0; hi - lo > 1; depth++) {
        path[depth] = &m->nodes[i];
        if (source < path[depth]->mid) {
            hi = path[depth]->mid;
            i = 2 * i + 1;
        } else {
            lo = path[depth]->mid;
            i = 2 * i + 2;
        }
    }
    while (depth-- > 0) {
        const node *n = path[depth];
        k = side_position(n, source >= n->mid, k);
    }
    return k;
}

uint64_t bw__mixture_consumed(const bw__mixture *m, uint32_t source, uint64_t pos)
{
    uint64_t lo = 0, hi = m->nsources;
    for (size_t i = 0; hi - lo > 1;) {
        const node *n = &m->nodes[i];
        bool at;
        uint64_t left = left_before_at(n, pos, &at);
        if (source < n->mid) {
            hi = n->mid;
            pos = left;
            i = 2 * i + 1;
        } else {
            lo = n->mid;
            pos -= left;
            i = 2 * i + 2;
        }
    }
    return pos;
}

/* Where source j's stream stands at the epoch's start. */
static uint64_t stream_base(const bw__mixture *m, uint32_t source)
{
    if (m->streams[source] && m->policy == BW__MIX_STOP)
        return 0;
    /* (epoch + 1) * E < 2^64 was checked, and c_j <= E */
    return m->epoch * m->counts[source];
}

uint64_t bw__mixture_stream_position(const bw__mixture *m, uint32_t source, uint64_t k)
{
    return stream_base(m, source) + k;
}

uint64_t bw__mixture_pass(const bw__mixture *m, uint32_t source, uint64_t k)
{
    return bw__mixture_stream_position(m, source, k) / m->sizes[source];
}

uint64_t bw__mixture_index(const bw__mixture *m, uint32_t source, uint64_t k)
{
    uint64_t t = bw__mixture_stream_position(m, source, k), n = m->sizes[source];
    if (m->streams[source])
        return t % n; /* a stream is read in its own order, every pass */
    return bw__mix_permute(m->seed, source, t / n, n, t % n);
}

void bw__mixture_at(const bw__mixture *m, uint64_t pos, uint32_t *source, uint64_t *index,
                    uint64_t *pass)
{
    uint64_t k;
    bw__mixture_locate(m, pos, source, &k);
    *index = bw__mixture_index(m, *source, k);
    if (pass)
        *pass = bw__mixture_pass(m, *source, k);
}

/*
 * bw__mixture_at_many goes down the tree with a chunk of the batch's items at once. At a node
 * the items that reach it are taken in batch order -- a run of nearby ones merged at once
 * (merge_span), the others reached by walking the node's merge forward (left_before) -- and
 * split, still in order, between the two children; at a leaf, the items of one (source,
 * pass) are permuted with one key schedule (bw__feistel_at_run). Per item: about a merge step
 * per level and one encryption, without the per-position descent of bw__mixture_locate.
 */
enum { CHUNK = 256 };

typedef struct chunk {
    const bw__mixture *m;
    uint64_t p[CHUNK]; /* item i's position in the node it has reached; at a leaf, its k */
    uint16_t ids[CHUNK], spare[CHUNK];
    uint32_t *sources;
    uint64_t *indices, *passes;
} chunk;

/* Items ids[0, count) have reached source j, item ids[w] at element c->p[ids[w]] of the
 * source's part of the order, or, when `run`, at element k0 + w: their sample indices, a
 * pass's run at a time. */
static void leaf(chunk *c, uint32_t j, const uint16_t *ids, size_t count, bool run, uint64_t k0)
{
    const bw__mixture *m = c->m;
    uint64_t base = stream_base(m, j), nj = m->sizes[j];
    uint64_t x[CHUNK];
    for (size_t w = 0, r; w < count; w = r) {
        uint64_t pass = (base + (run ? k0 + w : c->p[ids[w]])) / nj, start = pass * nj;
        for (r = w; r < count; r++) {
            /* (epoch + 1) E < 2^64 was checked */
            uint64_t t = base + (run ? k0 + r : c->p[ids[r]]);
            if (t < start || t - start >= nj)
                break; /* another pass: the next run */
            x[r - w] = t - start;
        }
        if (!m->streams[j]) { /* a stream is read in its own order, every pass */
            bw__feistel f;
            permutation_init(&f, m->seed, j, pass, nj);
            bw__feistel_at_run(&f, x, r - w);
        }
        for (size_t q = w; q < r; q++) {
            c->sources[ids[q]] = j;
            c->indices[ids[q]] = x[q - w];
            if (c->passes)
                c->passes[ids[q]] = pass;
        }
    }
}

enum {
    MERGE_SPAN = 2 * CHUNK, /* the most positions merged at once */
    MERGE_MIN = 16          /* the fewest items worth a merge of their span (two random accesses) */
};

/* Left keys among the first d of the merge of ascending lk[0, nl) and rk[0, nr) (a left key
 * first on a tie): left key i is among them when d - i - 1 >= nr or lk[i] <= rk[d - i - 1],
 * true up to some i and false after, so a binary search over the i where both are in range. */
static size_t merge_split(const u128 *lk, size_t nl, const u128 *rk, size_t nr, size_t d)
{
    size_t lo = d > nr ? d - nr : 0, hi = d < nl ? d : nl;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (lk[mid] <= rk[d - mid - 1])
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* One step of a branchless merge at output q: merged[q] = 2 x (left keys before) + (the next
 * is a left key); a <= nl and b <= nr, one side ending at its sentinel while the other runs. */
static inline void merge_step(const u128 *lk, const u128 *rk, size_t *a, size_t *b, size_t q,
                              uint16_t *merged)
{
    bool left = lk[*a] <= rk[*b]; /* a left key first on a tie */
    merged[q] = (uint16_t)(2 * *a + left);
    *a += left;
    *b += !left;
}

enum { MERGE_CHAINS = 4 };

/*
 * The merge of ascending keys lk[0, nl) and rk[0, nr) (each followed by a sentinel above any
 * key), span = nl + nr outputs, as MERGE_CHAINS merges of a quarter each, started where
 * merge_split puts them and stepped side by side. One merge is a chain of dependent steps (the
 * next keys' addresses wait on the comparison before) ~9 cycles each; four independent chains
 * overlap in the processor (docs/performance.md, "Mixture jobs, eighth pass").
 */
static void merge_chains(const u128 *lk, size_t nl, const u128 *rk, size_t nr, size_t span,
                         uint16_t *merged)
{
    size_t d[MERGE_CHAINS + 1], a[MERGE_CHAINS], b[MERGE_CHAINS];
    for (size_t g = 0; g < MERGE_CHAINS; g++) {
        d[g] = span * g / MERGE_CHAINS;
        a[g] = merge_split(lk, nl, rk, nr, d[g]);
        b[g] = d[g] - a[g];
    }
    d[MERGE_CHAINS] = span;
    size_t len = span / MERGE_CHAINS; /* every chain's length is len or len + 1 */
    size_t a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], b0 = b[0], b1 = b[1], b2 = b[2], b3 = b[3];
    for (size_t q = 0; q < len; q++) {
        merge_step(lk, rk, &a0, &b0, d[0] + q, merged);
        merge_step(lk, rk, &a1, &b1, d[1] + q, merged);
        merge_step(lk, rk, &a2, &b2, d[2] + q, merged);
        merge_step(lk, rk, &a3, &b3, d[3] + q, merged);
    }
    a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3, b[0] = b0, b[1] = b1, b[2] = b2, b[3] = b3;
    for (size_t g = 0; g < MERGE_CHAINS; g++)
        for (size_t q = d[g] + len; q < d[g + 1]; q++)
            merge_step(lk, rk, &a[g], &b[g], q, merged);
}

/*
 * The node's merge over positions [p0, p0 + span) (span <= MERGE_SPAN, p0 + span <= A + B):
 * merged[q] = 2 x (left elements among positions [p0, p0 + q)) + (element p0 + q is a left
 * one); *c0: the left elements before p0. Both ends by random access tell how many elements
 * of each side lie in the span; their keys are computed first, independently of each other
 * (the processor overlaps them), then the two ascending runs of keys are merged without a
 * branch (a left key first on a tie). The walk of left_before instead computes each key after
 * the comparison before it, one chain of hashes and multiplications, and mispredicts which
 * side comes next about half the time.
 */
static void merge_span(const node *n, uint64_t p0, uint64_t span, uint16_t *merged, uint64_t *c0)
{
    bool at;
    uint64_t c = left_before_at(n, p0, &at), m = p0 - c;
    size_t nl = left_before_at(n, p0 + span, &at) - c, nr = span - nl;
    *c0 = c;
    const u128 fits = (u128)1 << (128 - JITTER_BITS);
    if ((u128)(c + nl) * n->B <= fits && (u128)(m + nr) * n->A <= fits) {
        /* Every key of the span below 2^128 ((k + 1) F <= 2^96: any epoch of up to 2^48
         * samples): a key is one 128-bit number, and past each side's last key stands one
         * above any key (keys stay below 2^128 - F), so the merge needs no test of which side
         * is done. */
        u128 lk[MERGE_SPAN + 1], rk[MERGE_SPAN + 1];
        keys128(n, 0, c, nl, lk);
        keys128(n, 1, m, nr, rk);
        lk[nl] = rk[nr] = ~(u128)0;
        merge_chains(lk, nl, rk, nr, span, merged);
        return;
    }
    key160 lk[MERGE_SPAN], rk[MERGE_SPAN];
    for (size_t k = 0; k < nl; k++)
        lk[k] = node_key(n, 0, c + k);
    for (size_t k = 0; k < nr; k++)
        rk[k] = node_key(n, 1, m + k);
    size_t a = 0, b = 0;
    for (size_t q = 0; q < span; q++) {
        bool left = b >= nr || (a < nl && left_first(&lk[a], &rk[b])); /* one side done */
        merged[q] = (uint16_t)(2 * a + left);
        a += left;
        b += !left;
    }
}

/* The end of the run of items from ids[w] on that merge_span covers: ascending positions at
 * most MEMO_STEPS apart (as a walk would take them), within MERGE_SPAN of the first. */
static size_t run_end(const chunk *c, const uint16_t *ids, size_t count, size_t w)
{
    uint64_t p0 = c->p[ids[w]];
    size_t e = w + 1;
    for (; e < count; e++) {
        uint64_t p = c->p[ids[e]], prev = c->p[ids[e - 1]];
        if (p <= prev || p - prev > MEMO_STEPS || p - p0 >= MERGE_SPAN)
            break;
    }
    return e;
}

/* Items ids[0, count), in batch order, have reached node i (sources [lo, hi)). Runs of
 * nearby items are merged at once (merge_span), the rest walked (left_before). */
static void descend(chunk *c, size_t i, uint64_t lo, uint64_t hi, uint16_t *ids, size_t count)
{
    if (count == 0)
        return;
    if (hi - lo == 1) {
        leaf(c, (uint32_t)lo, ids, count, false, 0);
        return;
    }
    const node *n = &c->m->nodes[i];
    pos_memo mm = {.set = false};
    uint16_t merged[MERGE_SPAN];
    uint64_t p0 = 0, c0 = 0;
    size_t run = 0; /* the current run's end */
    bool run_merged = false;
    uint16_t *right = c->spare + (ids - c->ids); /* this node's part of the scratch */
    size_t nl = 0, nr = 0;
    for (size_t w = 0; w < count; w++) {
        uint16_t id = ids[w];
        uint64_t p = c->p[id], left;
        bool at;
        if (w == run) {
            run = run_end(c, ids, count, w);
            run_merged = run - w >= MERGE_MIN;
            if (run_merged) {
                p0 = p;
                merge_span(n, p0, c->p[ids[run - 1]] - p0 + 1, merged, &c0);
            }
        }
        if (run_merged) {
            at = merged[p - p0] & 1;
            left = c0 + (merged[p - p0] >> 1);
#ifndef NDEBUG
            bool at_direct;
            BW_INVARIANT(left_before_at(n, p, &at_direct) == left && at_direct == at,
                         "a mixture's merged span agrees with its random access");
#endif
        } else {
            left = left_before(n, &mm, p, &at);
        }
        /* Without a branch: which side comes next is as good as random, a mispredicted
         * branch an item. nl <= w, so an item not read yet is never overwritten. */
        c->p[id] = at ? left : p - left;
        ids[nl] = id;
        right[nr] = id;
        nl += at;
        nr += !at;
    }
    memcpy(ids + nl, right, nr * sizeof(*ids));
    descend(c, 2 * i + 1, lo, n->mid, ids, nl);
    descend(c, 2 * i + 2, n->mid, hi, ids + nl, nr);
}

/*
 * Items ids[0, count), in batch order, have reached node i (sources [lo, hi)) at consecutive
 * positions p0 .. p0 + count - 1 (a batch's own positions in accelerate mode and at world size
 * 1): their span merged at once and split between the children, whose items are again at
 * consecutive positions (the left ones at c0 .., the right ones at p0 - c0 ..), down to the
 * leaves, which permute their runs without reading positions back item by item.
 */
static void descend_run(chunk *c, size_t i, uint64_t lo, uint64_t hi, uint64_t p0, uint16_t *ids,
                        size_t count)
{
    if (count == 0)
        return;
    if (hi - lo == 1) {
        leaf(c, (uint32_t)lo, ids, count, true, p0);
        return;
    }
    const node *n = &c->m->nodes[i];
    uint16_t merged[MERGE_SPAN];
    uint64_t c0;
    merge_span(n, p0, count, merged, &c0);
    uint16_t *right = c->spare + (ids - c->ids); /* this node's part of the scratch */
    size_t nl = 0, nr = 0;
    for (size_t w = 0; w < count; w++) { /* without a branch, as in descend */
        uint16_t id = ids[w];
        bool at = merged[w] & 1;
#ifndef NDEBUG
        bool at_direct;
        BW_INVARIANT(left_before_at(n, p0 + w, &at_direct) == c0 + (merged[w] >> 1) &&
                         at_direct == at,
                     "a mixture's merged run agrees with its random access");
#endif
        ids[nl] = id;
        right[nr] = id;
        nl += at;
        nr += !at;
    }
    memcpy(ids + nl, right, nr * sizeof(*ids));
    descend_run(c, 2 * i + 1, lo, n->mid, c0, ids, nl);
    descend_run(c, 2 * i + 2, n->mid, hi, p0 - c0, ids + nl, nr);
}

void bw__mixture_at_many(const bw__mixture *m, const uint64_t *pos, size_t n, uint32_t *sources,
                         uint64_t *indices, uint64_t *passes)
{
    chunk c;
    c.m = m;
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t count = n - off < CHUNK ? n - off : CHUNK;
        bool run = true;
        for (size_t i = 0; i < count; i++) { /* read before indices (maybe pos) are written */
            c.p[i] = pos[off + i];
            c.ids[i] = (uint16_t)i;
            run &= c.p[i] == c.p[0] + i;
        }
        c.sources = sources + off;
        c.indices = indices + off;
        c.passes = passes ? passes + off : NULL;
        if (run)
            descend_run(&c, 0, 0, m->nsources, c.p[0], c.ids, count);
        else
            descend(&c, 0, 0, m->nsources, c.ids, count);
    }
}

uint64_t bw__mixture_next_record(const bw__mixture *m, uint32_t source, uint64_t pos,
                                 uint64_t *pass)
{
    uint64_t t = stream_base(m, source) + bw__mixture_consumed(m, source, pos);
    uint64_t n = m->sizes[source];
    if (m->streams[source] && m->policy == BW__MIX_STOP) {
        *pass = 0;
        return t; /* at most n_j: positions before P never need record n_j */
    }
    *pass = t / n;
    return t % n;
}

int bw__mix_sampler_new(bw__mix_sampler **out, const bw__mix_spec *spec, const bw__sampler_cfg *cfg,
                        const Batchwire__V1__WorldSegment *const *history, size_t nhistory,
                        uint64_t epoch, char *err, size_t errlen)
{
    *out = NULL;
    if (cfg->shuffle)
        return bw__refuse(err, errlen,
                          "shuffle: a mixture orders its sources itself (a seeded permutation "
                          "within each source, a seeded interleave); leave shuffle off");
    bw__mix_sampler *s = calloc(1, sizeof(*s));
    if (!s) {
        if (err && errlen)
            snprintf(err, errlen, "out of memory for a mixture's sampler");
        return BW_NOMEM;
    }
    int rc = bw__mixture_new(&s->mix, spec, cfg->seed, epoch, err, errlen);
    if (s->mix) { /* set exactly when rc is BW_OK */
        bw__sampler_cfg positions = *cfg;
        positions.num_samples = s->mix->end;
        rc = bw__job_sampler_new_cfg(&positions, history, nhistory, epoch, false, &s->positions,
                                     err, errlen);
    }
    if (rc != BW_OK) {
        bw__mix_sampler_free(s);
        return rc;
    }
    *out = s;
    return BW_OK;
}

void bw__mix_sampler_free(bw__mix_sampler *s)
{
    if (!s)
        return;
    bw__sampler_free(s->positions);
    bw__mixture_free(s->mix);
    free(s);
}

const bw__mixture *bw__mix_sampler_mixture(const bw__mix_sampler *s)
{
    return s->mix;
}

const bw__sampler *bw__mix_sampler_positions(const bw__mix_sampler *s)
{
    return s->positions;
}

int bw__mix_sampler_batch(const bw__mix_sampler *s, uint64_t rank, uint64_t step, bw__batch *out,
                          uint32_t *sources, uint64_t *passes)
{
    int rc = bw__sampler_batch(s->positions, rank, step, out);
    if (rc != BW_OK)
        return rc;
    bw__mixture_at_many(s->mix, out->indices, out->count, sources, out->indices, passes);
    return BW_OK;
}
