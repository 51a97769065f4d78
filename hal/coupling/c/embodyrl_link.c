/* link_open / link_exchange / link_close: the C twin of hal/coupling/link.py (see embodyrl_link.h).
 *
 * The learner side cannot tell this rank from a Python one: the same HELLO (protocol 2, written in
 * protocol 1; it adds "weights": ["full"], the only encoding taken here), the same STEPS columns
 * (docs/coupling.md), sequence numbers resent after a reconnect until acknowledged, credits, and
 * heartbeats. A learner that goes silent, dies or never answers costs zero corrections (or the
 * last weights', by configuration) and a line on stderr; every wait has a deadline. */
#define _GNU_SOURCE
#include "embodyrl_link.h"

#include <math.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "el_policy.h"
#include "el_spool.h"
#include "el_wire.h"

enum { WARN_KINDS = 8 };
typedef enum { W_NO_WEIGHTS, W_LOST, W_SPOOL, W_WEIGHTS, W_MESSAGE, W_REFUSED, W_UNREACHABLE, W_INPUT } warn_kind;

typedef struct {
    long capacity, rows;
    float *profile, *context, *action, *reward;
    int64_t *episode, *incarnation, *count;
    int32_t *step;
} column_batch;

struct link_t {
    link_config cfg;
    link_stats stats;
    el_policy policy;
    int window;
    float *windows, *scratch;
    long windows_rows;
    /* streaming */
    int64_t *episodes, *order;
    long columns, order_len, picked, step_index;
    column_batch batch;
    int exchanges_in_batch;
    uint64_t rng[4];
    /* the learner */
    void *ctx, *socket, *monitor;
    int connected, ended;
    int64_t seq, acked_seq, sent_upto, credits, held_incarnation, held_count;
    double last_heard, last_sent, next_hello, lost_since, learner_timeout_s, opened_at;
    char instance[17];
    el_spool spool;
    long warnings[WARN_KINDS];
};

/* -- small helpers ---------------------------------------------------------------------------- */
static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static double cpu_s(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static double thread_cpu_s(void) { return cpu_s(CLOCK_THREAD_CPUTIME_ID); }

static void warn(link_t *l, warn_kind kind, const char *fmt, ...) {
    long n = l->warnings[kind]++;
    if (n % 100) return; /* the first of each kind, and every 100th after it */
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "embodyrl_link rank %d: ", l->cfg.rank);
    vfprintf(stderr, fmt, args);
    fprintf(stderr, " (%ld times so far)\n", n + 1);
    va_end(args);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t *s) { /* xoshiro256** */
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t, s[3] = rotl(s[3], 45);
    return result;
}

static double uniform(uint64_t *s) { return (next_u64(s) >> 11) * 0x1.0p-53; }

static double normal(uint64_t *s) {
    double u = uniform(s), v = uniform(s);
    return sqrt(-2.0 * log(u > 0 ? u : 1e-300)) * cos(2 * M_PI * v);
}

static int is_loopback(const char *endpoint) {
    if (!strncmp(endpoint, "ipc://", 6) || !strncmp(endpoint, "inproc://", 9)) return 1;
    return !strncmp(endpoint, "tcp://127.", 10) || !strncmp(endpoint, "tcp://localhost:", 16) ||
           !strncmp(endpoint, "tcp://[::1]:", 12);
}

/* -- configuration ---------------------------------------------------------------------------- */
void link_config_defaults(link_config *c) {
    memset(c, 0, sizeof *c);
    c->radius = 2, c->max_correction = 1.0f, c->explore = 1;
    c->stream_fraction = 1.0, c->stream_every = 1, c->send_every = 1;
    c->connect_timeout_s = 10.0, c->peer_timeout_s = 10.0, c->zero_when_learner_lost = 1;
    c->spool_bytes = (size_t)256 << 20, c->inference_rows = 4096;
}

int link_config_parse(link_config *c, const char *text) {
    char *copy = strdup(text), *save = NULL;
    int status = 0;
    for (char *word = strtok_r(copy, " ,\t\n\r", &save); word; word = strtok_r(NULL, " ,\t\n\r", &save)) {
        char *eq = strchr(word, '=');
        if (!eq) { fprintf(stderr, "embodyrl_link: config word %s is not key=value\n", word); status = -1; break; }
        *eq = 0;
        const char *k = word, *v = eq + 1;
        char *end = NULL;
#define INT(name) if (!strcmp(k, #name)) { c->name = (int)strtol(v, &end, 10); }
#define DBL(name) if (!strcmp(k, #name)) { c->name = strtod(v, &end); }
#define STR(name) if (!strcmp(k, #name)) { if (strlen(v) >= LINK_TEXT) { end = (char *)v; } else { strcpy(c->name, v); end = (char *)v + strlen(v); } }
        INT(rank) else INT(levels) else INT(features) else INT(context) else INT(radius)
        else INT(allow_insecure) else INT(explore) else INT(stream_every) else INT(send_every)
        else INT(zero_when_learner_lost) else INT(inference_rows)
        else DBL(stream_fraction) else DBL(connect_timeout_s) else DBL(peer_timeout_s) else DBL(weights_wait_s)
        else STR(learner) else STR(policy) else STR(secret_key) else STR(server_key)
        else if (!strcmp(k, "max_correction")) { c->max_correction = strtof(v, &end); }
        else if (!strcmp(k, "spool_bytes")) { c->spool_bytes = (size_t)strtoull(v, &end, 10); }
        else if (!strcmp(k, "seed")) { c->seed = strtoull(v, &end, 10); }
        else if (!strcmp(k, "on_spool_full")) {
            c->on_spool_full = !strcmp(v, "drop_newest") ? LINK_DROP_NEWEST : LINK_DROP_OLDEST;
            end = strcmp(v, "drop_newest") && strcmp(v, "drop_oldest") ? (char *)v : (char *)v + strlen(v);
        } else { fprintf(stderr, "embodyrl_link: unknown config key %s\n", k); status = -1; break; }
#undef INT
#undef DBL
#undef STR
        if (!end || *end) { fprintf(stderr, "embodyrl_link: config %s=%s: bad value\n", k, v); status = -1; break; }
    }
    free(copy);
    return status;
}

static int check_config(const link_config *c) {
    const char *bad = NULL;
    if (c->levels < 1 || c->features < 1 || c->context < 0 || c->radius < 0) bad = "levels, features >= 1; context, radius >= 0";
    else if (!(c->max_correction > 0)) bad = "max_correction > 0";
    else if (!(c->stream_fraction > 0 && c->stream_fraction <= 1)) bad = "0 < stream_fraction <= 1";
    else if (c->stream_every < 1 || c->send_every < 1) bad = "stream_every, send_every >= 1";
    else if (c->rank < 0) bad = "rank >= 0";
    else if (!c->policy[0]) bad = "policy: the coupling policy's export (.msgpack) is required";
    else if (c->learner[0] && !c->secret_key[0] && !c->allow_insecure && !is_loopback(c->learner))
        bad = "refusing plain TCP to a non-loopback learner: give secret_key and server_key (embodyrl keys) "
              "or allow_insecure=1";
    else if (!c->secret_key[0] != !c->server_key[0]) bad = "secret_key and server_key go together";
    if (bad) fprintf(stderr, "embodyrl_link: bad config: %s\n", bad);
    return bad ? -1 : 0;
}

/* -- the learner connection ------------------------------------------------------------------- */
static int read_key(const char *path, const char *which, char out[41]) {
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "embodyrl_link: cannot open key file %s\n", path); return -1; }
    char line[256];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        char *at = strstr(line, which), *q1, *q2;
        if (at && (q1 = strchr(at, '"')) && (q2 = strchr(q1 + 1, '"')) && q2 - q1 - 1 == 40) {
            memcpy(out, q1 + 1, 40), out[40] = 0, found = 1;
        }
    }
    fclose(f);
    if (!found) fprintf(stderr, "embodyrl_link: %s holds no %s\n", path, which);
    return found ? 0 : -1;
}

static int set_int(void *s, int option, int value) { return zmq_setsockopt(s, option, &value, sizeof value); }

static int dial(link_t *l) {
    const link_config *c = &l->cfg;
    l->socket = zmq_socket(l->ctx, ZMQ_DEALER);
    int64_t max_message = ((int64_t)1 << 30) + 65536;
    zmq_setsockopt(l->socket, ZMQ_MAXMSGSIZE, &max_message, sizeof max_message);
    set_int(l->socket, ZMQ_LINGER, 0);
    set_int(l->socket, ZMQ_SNDHWM, 64);
    set_int(l->socket, ZMQ_RCVHWM, 64);
    set_int(l->socket, ZMQ_IMMEDIATE, 1); /* nothing queued without a connection: sends fail fast */
    set_int(l->socket, ZMQ_RECONNECT_IVL, 500);
    set_int(l->socket, ZMQ_RECONNECT_IVL_MAX, 10000);
    set_int(l->socket, ZMQ_HEARTBEAT_IVL, 1000);
    set_int(l->socket, ZMQ_HEARTBEAT_TIMEOUT, (int)(c->peer_timeout_s * 1000));
    if (c->secret_key[0]) {
        char public[41], secret[41], server[41];
        if (read_key(c->secret_key, "public-key", public) || read_key(c->secret_key, "secret-key", secret) ||
            read_key(c->server_key, "public-key", server))
            return -1;
        if (zmq_setsockopt(l->socket, ZMQ_CURVE_SERVERKEY, server, 40) ||
            zmq_setsockopt(l->socket, ZMQ_CURVE_PUBLICKEY, public, 40) ||
            zmq_setsockopt(l->socket, ZMQ_CURVE_SECRETKEY, secret, 40)) {
            fprintf(stderr, "embodyrl_link: CURVE keys refused: %s (libzmq without CURVE?)\n", zmq_strerror(zmq_errno()));
            return -1;
        }
    }
    char monitor[64];
    snprintf(monitor, sizeof monitor, "inproc://embodyrl-link-%p", (void *)l);
    zmq_socket_monitor(l->socket, monitor, ZMQ_EVENT_DISCONNECTED);
    l->monitor = zmq_socket(l->ctx, ZMQ_PAIR);
    set_int(l->monitor, ZMQ_LINGER, 0);
    zmq_connect(l->monitor, monitor);
    if (zmq_connect(l->socket, c->learner) != 0) {
        fprintf(stderr, "embodyrl_link: cannot connect to %s: %s\n", c->learner, zmq_strerror(zmq_errno()));
        return -1;
    }
    l->last_heard = now_s();
    return 0;
}

static void pack_version(msgpack_packer *pk, int64_t incarnation, int64_t count) {
    msgpack_pack_array(pk, 2);
    msgpack_pack_int64(pk, incarnation);
    msgpack_pack_int64(pk, count);
}

static void pack_spec(msgpack_packer *pk, const char *name, int ndim, const int64_t *shape, const float *bound) {
    msgpack_pack_map(pk, bound ? 5 : 3);
    el_pack_str(pk, "name"), el_pack_str(pk, name);
    el_pack_str(pk, "shape"), msgpack_pack_array(pk, ndim);
    for (int i = 0; i < ndim; i++) msgpack_pack_int64(pk, shape[i]);
    el_pack_str(pk, "dtype"), el_pack_str(pk, "float32");
    if (bound) {
        el_pack_str(pk, "minimum"), msgpack_pack_double(pk, -(double)*bound);
        el_pack_str(pk, "maximum"), msgpack_pack_double(pk, (double)*bound);
    }
}

static void hello_fields(msgpack_packer *pk, const void *arg) {
    const link_t *l = arg;
    const link_config *c = &l->cfg;
    char name[32];
    snprintf(name, sizeof name, "rank-%d", c->rank);
    msgpack_pack_map(pk, 8);
    el_pack_str(pk, "actor"), el_pack_str(pk, name);
    el_pack_str(pk, "actor_id"), msgpack_pack_int(pk, c->rank);
    el_pack_str(pk, "devices"), msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 4);
    el_pack_str(pk, "device_id"), msgpack_pack_int(pk, c->rank);
    el_pack_str(pk, "name"), el_pack_str(pk, name);
    el_pack_str(pk, "observation_spec"), msgpack_pack_array(pk, c->context ? 2 : 1);
    int64_t profile[2] = {c->levels, c->features}, context[1] = {c->context}, action[1] = {c->levels};
    pack_spec(pk, "profile", 2, profile, NULL);
    if (c->context) pack_spec(pk, "context", 1, context, NULL);
    el_pack_str(pk, "action_spec"), pack_spec(pk, "correction", 1, action, &c->max_correction);
    el_pack_str(pk, "last_acked_seq"), msgpack_pack_int64(pk, l->acked_seq);
    el_pack_str(pk, "held"), pack_version(pk, l->held_incarnation, l->held_count);
    el_pack_str(pk, "protocol"), msgpack_pack_int(pk, 2);
    el_pack_str(pk, "instance"), el_pack_str(pk, l->instance);
    el_pack_str(pk, "weights"), msgpack_pack_array(pk, 1), el_pack_str(pk, "full");
}

static void heartbeat_fields(msgpack_packer *pk, const void *arg) {
    const link_t *l = arg;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    msgpack_pack_map(pk, 2);
    el_pack_str(pk, "time"), msgpack_pack_double(pk, t.tv_sec + 1e-9 * t.tv_nsec);
    el_pack_str(pk, "held"), pack_version(pk, l->held_incarnation, l->held_count);
}

static void bye_fields(msgpack_packer *pk, const void *arg) {
    (void)arg;
    msgpack_pack_map(pk, 1);
    el_pack_str(pk, "reason"), el_pack_str(pk, "done");
}

static int send_message(link_t *l, int protocol, const char *kind, el_fields_writer fields) {
    el_frames f;
    el_encode(&f, protocol, kind, fields, l, NULL, 0);
    int status = el_send(l->socket, &f);
    el_frames_free(&f);
    if (status == 0) l->last_sent = now_s();
    return status;
}

static void hello(link_t *l) {
    double t = now_s();
    int events = 0;
    size_t size = sizeof events;
    if (l->connected || l->ended || t < l->next_hello) return;
    zmq_getsockopt(l->socket, ZMQ_EVENTS, &events, &size);
    if (!(events & ZMQ_POLLOUT)) return; /* no connection yet (IMMEDIATE) */
    if (send_message(l, 1, "HELLO", hello_fields) == 0) l->next_hello = t + l->cfg.peer_timeout_s;
}

static void disconnect(link_t *l) {
    if (l->connected) l->stats.reconnects++;
    l->connected = 0, l->credits = 0, l->next_hello = 0;
    if (l->lost_since == 0) l->lost_since = now_s();
}

static void pump(link_t *l) {
    if (!l->connected) return;
    for (el_batch *b = l->spool.head; b; b = b->next) {
        if (b->seq <= l->sent_upto) continue;
        if (b->rows > l->credits || el_send(l->socket, &b->frames) != 0) break;
        l->credits -= b->rows, l->sent_upto = b->seq, l->last_sent = now_s();
    }
}

static void handle(link_t *l, el_message *m) {
    int64_t value, credits;
    char why[160];
    if (!strcmp(m->kind, "ACK")) {
        if (el_get_int(m->fields, "seq", &value) || el_get_int(m->fields, "credits", &credits)) return;
        el_spool_ack(&l->spool, value);
        if (value > l->acked_seq) l->acked_seq = value;
        l->credits += credits;
    } else if (!strcmp(m->kind, "WEIGHTS")) {
        if (el_policy_take(&l->policy, m, why, sizeof why) != 0) {
            l->stats.weights_refused++;
            l->held_incarnation = 0, l->held_count = -1; /* the learner then sends full weights again */
            warn(l, W_WEIGHTS, "weights refused: %s", why);
            return;
        }
        l->held_incarnation = l->policy.incarnation, l->held_count = l->policy.count;
        l->stats.weights_taken++;
    } else if (!strcmp(m->kind, "WELCOME")) {
        int64_t protocol;
        double timeout;
        if (el_get_int(m->fields, "protocol", &protocol) || protocol != 2) {
            warn(l, W_REFUSED, "the learner speaks another wire protocol; upgrade one side");
            l->ended = 1;
            return;
        }
        if (el_get_int(m->fields, "committed_seq", &value) || el_get_int(m->fields, "credits", &credits)) return;
        if (el_get_double(m->fields, "peer_timeout_s", &timeout) == 0 && timeout > 0) l->learner_timeout_s = timeout;
        el_spool_ack(&l->spool, value);
        if (value > l->acked_seq) l->acked_seq = value;
        if (value > l->seq) l->seq = value;
        l->sent_upto = value; /* everything after it is resent, in order */
        l->credits = credits, l->connected = 1, l->lost_since = 0;
    } else if (!strcmp(m->kind, "REFUSED") || !strcmp(m->kind, "BYE")) {
        char reason[256] = "";
        el_get_str(m->fields, "reason", reason, sizeof reason);
        warn(l, W_REFUSED, "the learner %s: %s", !strcmp(m->kind, "BYE") ? "said goodbye" : "refused us", reason);
        if (!strcmp(m->kind, "REFUSED")) l->ended = 1; /* a refused rank goes on with the weights it has */
        else disconnect(l);
    }
}

static void service(link_t *l, int timeout_ms) {
    if (!l->socket) return;
    zmq_pollitem_t item = {l->socket, 0, ZMQ_POLLIN, 0};
    while (zmq_poll(&item, 1, timeout_ms) > 0 && (item.revents & ZMQ_POLLIN)) {
        timeout_ms = 0;
        el_message m;
        char why[128];
        int got = el_receive(l->socket, &m, why, sizeof why);
        if (got != 0) l->last_heard = now_s();
        if (got == 1) handle(l, &m);
        else if (got < 0) warn(l, W_MESSAGE, "message from the learner refused: %s", why);
        el_message_free(&m);
        if (got == 0) break;
    }
    for (;;) { /* a dropped connection ends the session: the next one is a new identity */
        zmq_msg_t event;
        zmq_msg_init(&event);
        int n = zmq_msg_recv(&event, l->monitor, ZMQ_DONTWAIT);
        if (n >= 0 && zmq_msg_more(&event)) {
            zmq_msg_t address;
            zmq_msg_init(&address);
            zmq_msg_recv(&address, l->monitor, 0);
            zmq_msg_close(&address);
        }
        zmq_msg_close(&event);
        if (n < 0) break;
        disconnect(l);
    }
    double t = now_s();
    if (l->connected && (t - l->last_heard > l->cfg.peer_timeout_s || t - l->last_sent > l->learner_timeout_s))
        disconnect(l); /* it went silent, or we did for longer than it keeps a session */
    if (!l->connected) { hello(l); return; }
    pump(l);
    if (t - l->last_sent >= 1.0) send_message(l, 2, "HEARTBEAT", heartbeat_fields);
}

/* -- streaming -------------------------------------------------------------------------------- */
static void *grow(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) { fprintf(stderr, "embodyrl_link: out of memory\n"); abort(); }
    return q;
}

static void batch_reserve(link_t *l, long rows) {
    column_batch *b = &l->batch;
    if (b->rows + rows <= b->capacity) return;
    long cap = b->rows + rows > 2 * b->capacity ? b->rows + rows : 2 * b->capacity;
    const link_config *c = &l->cfg;
    b->profile = grow(b->profile, sizeof(float) * cap * c->levels * c->features);
    b->context = grow(b->context, sizeof(float) * cap * (c->context ? c->context : 1));
    b->action = grow(b->action, sizeof(float) * cap * c->levels);
    b->reward = grow(b->reward, sizeof(float) * cap);
    b->episode = grow(b->episode, sizeof(int64_t) * cap);
    b->incarnation = grow(b->incarnation, sizeof(int64_t) * cap);
    b->count = grow(b->count, sizeof(int64_t) * cap);
    b->step = grow(b->step, sizeof(int32_t) * cap);
    b->capacity = cap;
}

static void steps_fields(msgpack_packer *pk, const void *arg) {
    const link_t *l = arg;
    msgpack_pack_map(pk, 3);
    el_pack_str(pk, "seq"), msgpack_pack_int64(pk, l->seq + 1);
    el_pack_str(pk, "device_id"), msgpack_pack_int(pk, l->cfg.rank);
    el_pack_str(pk, "held"), pack_version(pk, l->held_incarnation, l->held_count);
}

static el_array column(const char *name, const char *dtype, int ndim, int64_t d0, int64_t d1, int64_t d2,
                       const void *data, size_t item) {
    el_array a = {.dtype = dtype, .ndim = ndim, .shape = {d0, d1, d2}, .data = data};
    snprintf(a.name, sizeof a.name, "%s", name);
    a.nbytes = item * (size_t)d0 * (ndim > 1 ? (size_t)d1 : 1) * (ndim > 2 ? (size_t)d2 : 1);
    return a;
}

static void send_pending(link_t *l) {
    column_batch *b = &l->batch;
    l->exchanges_in_batch = 0;
    long m = b->rows;
    if (m == 0) return;
    const link_config *c = &l->cfg;
    uint8_t *ones = malloc((size_t)m), *zeros = calloc((size_t)m, 1);
    int32_t *ids = malloc(sizeof(int32_t) * m);
    float *log_prob = calloc((size_t)m, sizeof(float));
    memset(ones, 1, (size_t)m);
    for (long i = 0; i < m; i++) ids[i] = c->rank;
    el_array arrays[16];
    int n = 0;
    arrays[n++] = column("observation/profile", "float32", 3, m, c->levels, c->features, b->profile, 4);
    if (c->context) arrays[n++] = column("observation/context", "float32", 2, m, c->context, 0, b->context, 4);
    arrays[n++] = column("action", "float32", 2, m, c->levels, 0, b->action, 4);
    arrays[n++] = column("log_prob", "float32", 1, m, 0, 0, log_prob, 4);
    arrays[n++] = column("reward", "float32", 1, m, 0, 0, b->reward, 4);
    arrays[n++] = column("terminated", "bool", 1, m, 0, 0, ones, 1);
    arrays[n++] = column("truncated", "bool", 1, m, 0, 0, zeros, 1);
    arrays[n++] = column("final", "bool", 1, m, 0, 0, zeros, 1);
    arrays[n++] = column("episode_id", "int64", 1, m, 0, 0, b->episode, 8);
    arrays[n++] = column("step_index", "int32", 1, m, 0, 0, b->step, 4);
    arrays[n++] = column("device_id", "int32", 1, m, 0, 0, ids, 4);
    arrays[n++] = column("actor_id", "int32", 1, m, 0, 0, ids, 4);
    arrays[n++] = column("policy_incarnation", "int64", 1, m, 0, 0, b->incarnation, 8);
    arrays[n++] = column("policy_count", "int64", 1, m, 0, 0, b->count, 8);
    arrays[n++] = column("source", "uint8", 1, m, 0, 0, zeros, 1);
    el_frames frames;
    el_encode(&frames, 2, "STEPS", steps_fields, l, arrays, n);
    free(ones), free(zeros), free(ids), free(log_prob);
    l->seq++;
    b->rows = 0;
    long dropped = el_spool_push(&l->spool, l->seq, m, &frames, c->on_spool_full == LINK_DROP_NEWEST);
    if (dropped) {
        l->stats.steps_dropped += dropped;
        warn(l, W_SPOOL, "spool full (%zu bytes): %ld steps dropped (%s)", c->spool_bytes, dropped,
             c->on_spool_full == LINK_DROP_NEWEST ? "the newest" : "the oldest");
    }
    l->stats.steps_sent += m - (dropped > m ? m : dropped);
    pump(l);
}

/* This streaming step's columns: a random stream_fraction of them, drawn without replacement across
 * steps (every column once per round; a new round starts with the last round's rest). */
static long pick_rows(link_t *l, long n, const int64_t **rows) {
    long k = lround(l->cfg.stream_fraction * n);
    if (k < 1) k = 1;
    if (k >= n) k = n;
    if (l->picked + k > l->order_len) {
        long rest = l->order_len - l->picked;
        int64_t *order = malloc(sizeof(int64_t) * (n + rest));
        uint8_t *in_rest = calloc((size_t)n, 1);
        for (long i = 0; i < rest; i++) order[i] = l->order[l->picked + i], in_rest[order[i]] = 1;
        int64_t *perm = malloc(sizeof(int64_t) * n);
        for (long i = 0; i < n; i++) perm[i] = i;
        for (long i = n - 1; i > 0; i--) {
            long j = (long)(next_u64(l->rng) % (uint64_t)(i + 1));
            int64_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        long at = rest;
        for (long i = 0; i < n; i++) if (!in_rest[perm[i]]) order[at++] = perm[i];
        for (long i = 0; i < n; i++) if (in_rest[perm[i]]) order[at++] = perm[i];
        free(l->order), free(in_rest), free(perm);
        l->order = order, l->order_len = at, l->picked = 0;
    }
    *rows = l->order + l->picked;
    l->picked += k;
    return k;
}

static void stream(link_t *l, long n, const float *state, const float *context, const float *target,
                   const float *answer) {
    const link_config *c = &l->cfg;
    if (l->columns != n) { /* a new column count: new episode ids, a new round of picks */
        l->episodes = grow(l->episodes, sizeof(int64_t) * n);
        for (long i = 0; i < n; i++) l->episodes[i] = (int64_t)(next_u64(l->rng) >> 2);
        l->columns = n, l->order_len = l->picked = 0;
    }
    const int64_t *rows;
    long k = pick_rows(l, n, &rows);
    if (l->batch.rows && l->batch.rows + k > (long)c->send_every * k) send_pending(l);
    batch_reserve(l, k);
    column_batch *b = &l->batch;
    const size_t L = (size_t)c->levels, LF = L * c->features;
    const float scale = 1.0f / ((float)L * c->max_correction * c->max_correction);
    for (long i = 0; i < k; i++) {
        long r = (long)rows[i], row = b->rows + i;
        memcpy(b->profile + row * LF, state + r * LF, sizeof(float) * LF);
        if (c->context) memcpy(b->context + row * c->context, context + r * c->context, sizeof(float) * c->context);
        memcpy(b->action + row * L, answer + r * L, sizeof(float) * L);
        float sum = 0;
        for (size_t j = 0; j < L; j++) {
            float e = answer[r * L + j] - target[r * L + j];
            sum += e * e;
        }
        b->reward[row] = -sum * scale;
        b->episode[row] = l->episodes[r];
        b->step[row] = (int32_t)l->step_index;
        b->incarnation[row] = l->policy.incarnation, b->count[row] = l->policy.count;
    }
    b->rows += k;
    l->step_index++;
    l->exchanges_in_batch++;
}

/* -- the forward pass ------------------------------------------------------------------------- */
static void infer(link_t *l, long n, const float *state, const float *context, float *out) {
    const link_config *c = &l->cfg;
    const int L = c->levels, F = c->features, C = c->context, R = c->radius, W = l->window;
    long level_rows = n * L;
    int block = c->inference_rows > 0 ? c->inference_rows : (int)level_rows;
    if (block > level_rows) block = (int)level_rows;
    if (l->windows_rows < block) {
        l->windows = grow(l->windows, sizeof(float) * (size_t)block * W);
        l->scratch = grow(l->scratch, sizeof(float) * 2 * (size_t)block * l->policy.max_width);
        l->windows_rows = block;
    }
    for (long lo = 0; lo < level_rows; lo += block) {
        long rows = level_rows - lo < block ? level_rows - lo : block;
        for (long i = 0; i < rows; i++) { /* level k of column j: levels k-R..k+R (edges repeated), context */
            long j = (lo + i) / L, k = (lo + i) % L;
            float *w = l->windows + i * W;
            for (int d = -R; d <= R; d++) {
                long kk = k + d < 0 ? 0 : (k + d >= L ? L - 1 : k + d);
                memcpy(w + (d + R) * F, state + ((size_t)j * L + kk) * F, sizeof(float) * F);
            }
            if (C) memcpy(w + (2 * R + 1) * F, context + (size_t)j * C, sizeof(float) * C);
        }
        el_policy_forward(&l->policy, (int)rows, l->windows, out + lo, l->scratch, (int)rows);
    }
    if (c->explore && l->policy.exploration_std > 0) {
        const double half = (l->policy.maximum - l->policy.minimum) / 2.0, std = l->policy.exploration_std;
        for (long i = 0; i < level_rows; i++) {
            float a = (float)(out[i] + normal(l->rng) * std * half);
            out[i] = a < l->policy.minimum ? l->policy.minimum : (a > l->policy.maximum ? l->policy.maximum : a);
        }
    } else {
        for (long i = 0; i < level_rows; i++)
            out[i] = out[i] < l->policy.minimum ? l->policy.minimum : (out[i] > l->policy.maximum ? l->policy.maximum : out[i]);
    }
}

/* -- the API ---------------------------------------------------------------------------------- */
link_t *link_open(const link_config *cfg) {
    if (check_config(cfg) != 0) return NULL;
    if (sodium_init() < 0) { fprintf(stderr, "embodyrl_link: libsodium failed to start\n"); return NULL; }
    link_t *l = calloc(1, sizeof *l);
    l->cfg = *cfg;
    l->window = (2 * cfg->radius + 1) * cfg->features + cfg->context;
    char why[256];
    if (el_policy_load(&l->policy, cfg->policy, l->window, cfg->max_correction, why, sizeof why) != 0) {
        fprintf(stderr, "embodyrl_link rank %d: policy %s: %s\n", cfg->rank, cfg->policy, why);
        free(l);
        return NULL;
    }
    uint64_t seed = cfg->seed ? cfg->seed : (uint64_t)time(NULL) ^ ((uint64_t)cfg->rank << 32);
    for (int i = 0; i < 4; i++) { /* splitmix64 */
        uint64_t z = (seed += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL, z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        l->rng[i] = z ^ (z >> 31);
    }
    unsigned char token[8];
    randombytes_buf(token, sizeof token);
    sodium_bin2hex(l->instance, sizeof l->instance, token, sizeof token);
    l->held_incarnation = 0, l->held_count = -1;
    l->spool.limit = cfg->spool_bytes;
    l->learner_timeout_s = cfg->peer_timeout_s;
    l->opened_at = now_s();
    if (!cfg->learner[0]) return l; /* a frozen policy */
    l->ctx = zmq_ctx_new();
    if (dial(l) != 0) { link_close(l, 0); return NULL; }
    double deadline = now_s() + cfg->connect_timeout_s;
    while (!l->connected && !l->ended && now_s() < deadline) service(l, 20);
    if (!l->connected) {
        warn(l, W_UNREACHABLE, "no WELCOME from %s within %.1f s%s; the model goes on and the link keeps trying",
             cfg->learner, cfg->connect_timeout_s, cfg->secret_key[0] ? " (is our key authorised there?)" : "");
        l->lost_since = now_s();
    }
    return l;
}

link_t *link_open_text(const char *text) {
    link_config cfg;
    link_config_defaults(&cfg);
    return text && link_config_parse(&cfg, text) == 0 ? link_open(&cfg) : NULL;
}

/* Whether every value is finite: the exponent bits of each float, OR-ed without a branch, so the
 * compiler vectorises it (the check reads the whole state every step). */
static int all_finite(const float *x, long n) {
    uint32_t bad = 0;
    for (long i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, x + i, sizeof bits);
        bad |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);
    }
    return !bad;
}

static int checked(link_t *l, int n, const float *state, const float *context, const float *target) {
    const link_config *c = &l->cfg;
    const char *bad = NULL;
    if (n < 0 || (n > 0 && !state)) bad = "state: missing";
    else if (c->context && n > 0 && !context) bad = "context: missing";
    else if (!all_finite(state, (long)n * c->levels * c->features)) bad = "state: non-finite values";
    else if (c->context && !all_finite(context, (long)n * c->context)) bad = "context: non-finite values";
    else if (target && !all_finite(target, (long)n * c->levels)) bad = "target: non-finite values";
    if (bad) warn(l, W_INPUT, "bad input, zero correction: %s", bad);
    return bad ? -1 : 0;
}

int link_exchange(link_t *l, int columns, const float *state, const float *context, const float *target,
                  float *correction) {
    if (!l) return -1; /* link_open failed and said why; the caller's correction is its own */
    const double t0 = thread_cpu_s();
    const link_config *c = &l->cfg;
    const long n = columns;
    int turn = l->stats.exchanges % c->stream_every == 0, status = 1;
    double inference_thread = 0;
    l->stats.exchanges++;
    if (checked(l, columns, state, context, target) != 0) {
        status = -1;
    } else {
        if (l->socket && l->exchanges_in_batch >= c->send_every) send_pending(l);
        if (l->socket) {
            service(l, 0);
            if (l->policy.count < 0 && c->weights_wait_s > 0) {
                double deadline = now_s() + c->weights_wait_s;
                while (l->policy.count < 0 && now_s() < deadline) service(l, 10);
            }
        }
        int lost = c->learner[0] && !l->connected && l->lost_since > 0;
        if (l->policy.count < 0) {
            warn(l, W_NO_WEIGHTS, "no policy weights yet: zero correction");
        } else if (lost && c->zero_when_learner_lost) {
            warn(l, W_LOST, "learner silent or unreachable: zero correction");
        } else {
            const double i0 = thread_cpu_s(), p0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID);
            infer(l, n, state, context, correction);
            l->stats.inference_cpu_s += cpu_s(CLOCK_PROCESS_CPUTIME_ID) - p0; /* a BLAS's threads included */
            inference_thread = thread_cpu_s() - i0;
            if (turn && target && l->socket && n > 0) stream(l, n, state, context, target, correction);
            status = 0;
        }
    }
    if (status != 0) { /* zeros: bad input, no weights yet, or the learner lost */
        memset(correction, 0, sizeof(float) * (size_t)(n > 0 ? n : 0) * c->levels);
        l->stats.zero_answers++;
    }
    l->stats.link_cpu_s += thread_cpu_s() - t0 - inference_thread;
    return status;
}

void link_stats_get(const link_t *l, link_stats *out) {
    *out = l->stats;
    out->incarnation = l->policy.incarnation, out->count = l->policy.count;
}

long link_flush(link_t *l, double flush_s) {
    if (!l || !l->socket) return 0;
    if (l->batch.rows) send_pending(l);
    double deadline = now_s() + flush_s;
    while (l->spool.head && !l->ended && now_s() < deadline) service(l, 20);
    return l->spool.batches;
}

void link_close(link_t *l, double flush_s) {
    if (!l) return;
    if (l->socket) {
        if (link_flush(l, flush_s))
            fprintf(stderr, "embodyrl_link rank %d: closing with %ld batches the learner did not acknowledge\n",
                    l->cfg.rank, l->spool.batches);
        if (l->connected) send_message(l, 2, "BYE", bye_fields);
        zmq_socket_monitor(l->socket, NULL, 0);
        zmq_close(l->monitor);
        zmq_close(l->socket);
        zmq_ctx_term(l->ctx);
    }
    el_spool_clear(&l->spool);
    el_policy_free(&l->policy);
    column_batch *b = &l->batch;
    free(b->profile), free(b->context), free(b->action), free(b->reward);
    free(b->episode), free(b->incarnation), free(b->count), free(b->step);
    free(l->windows), free(l->scratch), free(l->episodes), free(l->order);
    free(l);
}
