#include "el_spool.h"

#include <stdlib.h>

static void drop_head(el_spool *s) {
    el_batch *b = s->head;
    s->head = b->next;
    if (!s->head) s->tail = NULL;
    s->bytes -= el_frames_bytes(&b->frames);
    s->batches--;
    el_frames_free(&b->frames);
    free(b);
}

long el_spool_push(el_spool *s, int64_t seq, long rows, el_frames *frames, int drop_newest) {
    size_t size = el_frames_bytes(frames);
    long dropped = 0;
    if (s->bytes + size > s->limit && drop_newest) {
        el_frames_free(frames);
        return rows;
    }
    while (s->head && s->bytes + size > s->limit) {
        dropped += s->head->rows;
        drop_head(s);
    }
    if (size > s->limit) { /* larger than the whole spool */
        el_frames_free(frames);
        return dropped + rows;
    }
    el_batch *b = calloc(1, sizeof *b);
    b->seq = seq, b->rows = rows, b->frames = *frames;
    frames->frames = 0;
    if (s->tail) s->tail->next = b;
    else s->head = b;
    s->tail = b;
    s->bytes += size;
    s->batches++;
    return dropped;
}

void el_spool_ack(el_spool *s, int64_t seq) {
    while (s->head && s->head->seq <= seq) drop_head(s);
}

void el_spool_clear(el_spool *s) {
    while (s->head) drop_head(s);
}
