/* libembodyrl_link: a model rank's end of the embodyrl coupling, in C.
 *
 * The same link as the Python CouplingLink (docs/coupling.md): once per model
 * step each MPI rank hands its own columns to link_exchange and gets bounded
 * corrections back, computed here from the coupling policy (a per-level
 * network); while training it streams a fraction of its columns as steps to
 * the learner on the repository's wire and follows the weights the learner
 * publishes. No call waits without a deadline: a learner that is not up, has
 * died or has gone silent costs the model zero corrections (or the last
 * weights' corrections, by configuration) and one line on stderr, never a
 * stall.
 *
 *     link_config cfg;
 *     link_config_defaults(&cfg);
 *     link_config_parse(&cfg, "levels=70 features=3 context=2 rank=0 learner=tcp://host:5555");
 *     link_t *link = link_open(&cfg);                  // NULL: the reason is on stderr
 *     link_exchange(link, columns, state, context, target, correction);   // every step
 *     link_close(link);
 *
 * Arrays are float32, C order: state [columns][levels][features], context
 * [columns][context], target [columns][levels] (NULL: no reward, no streaming
 * this step), correction [columns][levels] (written). A Fortran model passes
 * state(features, levels, columns) and so on: the same bytes.
 */
#ifndef EMBODYRL_LINK_H
#define EMBODYRL_LINK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { LINK_TEXT = 512 };

typedef enum { LINK_DROP_OLDEST = 0, LINK_DROP_NEWEST = 1 } link_spool_full;

typedef struct link_config {
    int rank;                  /* this rank's id: the actor and device id at the learner */
    int levels, features, context;
    int radius;                /* levels on each side of a level's input window (default 2) */
    float max_correction;      /* bound of every correction (default 1) */
    char learner[LINK_TEXT];   /* learner endpoint, "" for a frozen policy */
    char policy[LINK_TEXT];    /* a coupling policy export (its .msgpack), "" to wait for the learner's weights */
    char secret_key[LINK_TEXT];/* this rank's CurveZMQ secret key file ("" : no CURVE) */
    char server_key[LINK_TEXT];/* the learner's public key file */
    int allow_insecure;        /* plain TCP to a non-loopback address (default 0: refused) */
    int explore;               /* add the policy's Gaussian exploration noise (default 1) */
    double stream_fraction;    /* fraction of the columns streamed on a streaming step (default 1) */
    int stream_every;          /* stream on every n-th step (default 1) */
    int send_every;            /* streaming steps per STEPS message (default 1) */
    double connect_timeout_s;  /* first handshake's deadline in link_open (default 10) */
    double peer_timeout_s;     /* learner silence after which it counts as lost (default 10) */
    double weights_wait_s;     /* how long an exchange may wait for the first weights (default 0) */
    int zero_when_learner_lost;/* zero corrections while the learner is lost (default 1; 0: last weights) */
    size_t spool_bytes;        /* memory for unacknowledged steps (default 256 MiB) */
    link_spool_full on_spool_full; /* which steps go when the spool is full */
    int inference_rows;        /* level rows per block of the forward pass (default 4096) */
    uint64_t seed;             /* exploration, column picks and episode ids (0: from the clock) */
} link_config;

typedef struct link_stats {
    long exchanges, zero_answers, steps_sent, steps_dropped, weights_taken, weights_refused, reconnects;
    double link_cpu_s;         /* the calling thread's CPU in the link's own work (inference excluded) */
    double inference_cpu_s;    /* the process's CPU in the forward pass (a BLAS's threads included) */
    int64_t incarnation, count;/* the weights that act now (count -1: none) */
} link_stats;

typedef struct link_t link_t;

void link_config_defaults(link_config *cfg);
/* Set fields from "key=value" words separated by spaces, commas or newlines (the names of the
 * fields above); returns 0, or -1 naming the bad word on stderr. */
int link_config_parse(link_config *cfg, const char *text);
link_t *link_open(const link_config *cfg);
/* link_config_defaults, link_config_parse(text), link_open: one call (for Fortran and C alike). */
link_t *link_open_text(const char *text);
/* Corrections for this rank's columns; returns 0, 1 when they are zeros (no weights yet, learner
 * lost), or -1 for bad input or a link that did not open (named on stderr; correction zeroed,
 * nothing streamed). */
int link_exchange(link_t *link, int columns, const float *state, const float *context,
                  const float *target, float *correction);
void link_stats_get(const link_t *link, link_stats *out);
/* Send the steps gathered so far and wait (at most flush_s) until the learner has acknowledged
 * every spooled batch; returns the batches still unacknowledged. */
long link_flush(link_t *link, double flush_s);
/* link_flush, then close. */
void link_close(link_t *link, double flush_s);

#ifdef __cplusplus
}
#endif
#endif
