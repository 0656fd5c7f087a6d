/* The refusal the pure modules (the sampler core's checks in core/sampler/layout.c, mixtures
 * in core/jobs/mixture.c) write for an input they do not accept: one sentence into err, and
 * BW_INVALID_ARGUMENT, the code their callers pass on. Inline: no symbol of its own. */
#ifndef BW_COMMON_REFUSE_H
#define BW_COMMON_REFUSE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "batchwire/batchwire.h"

/* Writes the sentence fmt describes into err (nothing when err is NULL or errlen 0);
 * returns BW_INVALID_ARGUMENT. */
static inline int bw__refuse(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline int bw__refuse(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return BW_INVALID_ARGUMENT;
}

#endif
