/* Batch bytes kept past the loader's next batch (hold.c, bw_loader_hold). Nothing here is part
 * of the public API. */
#ifndef BW_CLIENT_HOLD_H
#define BW_CLIENT_HOLD_H

#include "batchwire/loader.h"

typedef struct bw__holds bw__holds;

/* The holds of one loader (a reference for the loader); BW_NOMEM. */
int bw__holds_new(bw__holds **out);
/* The loader is closing: drops its reference; buffers released later are freed. */
void bw__holds_close(bw__holds *p);
/* A reference to the hold of the batch in a slot (*slot_hold, created when NULL). */
int bw__hold_take(bw__holds *p, bw_hold **slot_hold, const bw_batch *b, bw_hold **out);
/* The loader reuses the slot of b: a hold still referenced takes b's buffer, and b continues
 * with a spare buffer or none. Clears *slot_hold; NULL is a no-op. */
void bw__hold_leave_slot(bw_hold **slot_hold, bw_batch *b);

#endif
