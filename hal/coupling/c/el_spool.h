/* Step batches the learner has not acknowledged, oldest first, in bounded memory
 * (hal/wire/spool.py's job for a C rank): resent in order after a reconnect, dropped by
 * configuration when full. */
#ifndef EL_SPOOL_H
#define EL_SPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "el_wire.h"

typedef struct el_batch {
    int64_t seq;
    long rows;
    el_frames frames;
    struct el_batch *next;
} el_batch;

typedef struct {
    el_batch *head, *tail;
    size_t bytes, limit;
    long batches;
} el_spool;

/* Append a batch (taking its frames); when the limit would be passed, drop the oldest batches
 * (drop_newest = 0) or this one (1). Returns the rows dropped. */
long el_spool_push(el_spool *s, int64_t seq, long rows, el_frames *frames, int drop_newest);
/* Forget every batch up to and including seq (the learner holds them). */
void el_spool_ack(el_spool *s, int64_t seq);
void el_spool_clear(el_spool *s);

#endif
