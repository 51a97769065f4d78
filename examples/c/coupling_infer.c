/* A C model rank asking an embodyrl inference process for its columns' corrections.
 *
 *   cc -O2 -o coupling_infer coupling_infer.c -lzmq
 *   ./coupling_infer ENDPOINT RANK COLUMNS LEVELS FEATURES CONTEXT IN.f32 OUT.f32
 *
 * IN.f32 holds the rank's profile [COLUMNS, LEVELS, FEATURES] then its context
 * [COLUMNS, CONTEXT], float32 little-endian, C order (a Fortran model passes its
 * arrays transposed or declares them (FEATURES, LEVELS, COLUMNS)). OUT.f32 gets the
 * correction [COLUMNS, LEVELS]. One INFER request, one CORRECTION answer, over a
 * DEALER socket in the repository's codec (docs/coupling.md): a msgpack header
 * {"p": 1, "k": "INFER", "f": {"rank": R, "seq": 1}, "a": [[name, dtype, shape]...]}
 * then one raw frame per array. Waits at most 2 s (exit 2): a model applies a zero
 * correction then, never hangs. Little-endian hosts only.
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

typedef struct { uint8_t buf[512]; size_t n; } packer;

static void put(packer *p, uint8_t b) { if (p->n < sizeof p->buf) p->buf[p->n++] = b; }
static void put_str(packer *p, const char *s) {
    size_t len = strlen(s);
    put(p, (uint8_t)(0xa0 | len)); /* fixstr: names here are shorter than 32 bytes */
    for (size_t i = 0; i < len; i++) put(p, (uint8_t)s[i]);
}
static void put_uint(packer *p, uint32_t v) {
    if (v < 128) { put(p, (uint8_t)v); return; }
    put(p, 0xce); put(p, v >> 24); put(p, v >> 16); put(p, v >> 8); put(p, v);
}
static void put_array_desc(packer *p, const char *name, const uint32_t *shape, int ndim) {
    put(p, 0x93); put_str(p, name); put_str(p, "float32");
    put(p, (uint8_t)(0x90 | ndim));
    for (int i = 0; i < ndim; i++) put_uint(p, shape[i]);
}

int main(int argc, char **argv) {
    if (argc != 9) { fprintf(stderr, "usage: %s ENDPOINT RANK COLUMNS LEVELS FEATURES CONTEXT IN OUT\n", argv[0]); return 1; }
    uint32_t rank = atoi(argv[2]), m = atoi(argv[3]), L = atoi(argv[4]), F = atoi(argv[5]), C = atoi(argv[6]);
    size_t n_profile = (size_t)m * L * F, n_context = (size_t)m * C, n_out = (size_t)m * L;
    float *profile = malloc(4 * n_profile), *context = malloc(4 * (n_context + 1)), *out = malloc(4 * n_out);
    FILE *in = fopen(argv[7], "rb");
    if (!in || fread(profile, 4, n_profile, in) != n_profile || fread(context, 4, n_context, in) != n_context) {
        fprintf(stderr, "cannot read %zu + %zu floats from %s\n", n_profile, n_context, argv[7]); return 1;
    }
    fclose(in);

    packer h = {.n = 0};
    put(&h, 0x84);
    put_str(&h, "p"); put_uint(&h, 1);
    put_str(&h, "k"); put_str(&h, "INFER");
    put_str(&h, "f"); put(&h, 0x82); put_str(&h, "rank"); put_uint(&h, rank); put_str(&h, "seq"); put_uint(&h, 1);
    put_str(&h, "a"); put(&h, (uint8_t)(0x90 | (C ? 2 : 1)));
    uint32_t pshape[3] = {m, L, F}, cshape[2] = {m, C};
    put_array_desc(&h, "profile", pshape, 3);
    if (C) put_array_desc(&h, "context", cshape, 2);

    void *ctx = zmq_ctx_new(), *sock = zmq_socket(ctx, ZMQ_DEALER);
    int timeout_ms = 2000, linger = 0;
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(sock, argv[1]) != 0) { fprintf(stderr, "connect: %s\n", zmq_strerror(zmq_errno())); return 1; }
    zmq_send(sock, h.buf, h.n, ZMQ_SNDMORE);
    zmq_send(sock, profile, 4 * n_profile, C ? ZMQ_SNDMORE : 0);
    if (C) zmq_send(sock, context, 4 * n_context, 0);

    char header[512];
    int got = zmq_recv(sock, header, sizeof header, 0);
    int status = 0;
    if (got < 0) {
        fprintf(stderr, "no answer within %d ms: apply a zero correction\n", timeout_ms);
        memset(out, 0, 4 * n_out); status = 2;
    } else {
        int more = 0; size_t more_size = sizeof more;
        zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &more_size);
        int kind_ok = memmem(header, got < 512 ? got : 512, "CORRECTION", 10) != NULL;
        int frame = more ? zmq_recv(sock, out, 4 * n_out, 0) : -1;
        if (!kind_ok || frame != (int)(4 * n_out)) {
            fprintf(stderr, "unexpected answer (kind ok %d, %d bytes)\n", kind_ok, frame);
            memset(out, 0, 4 * n_out); status = 3;
        }
    }
    FILE *o = fopen(argv[8], "wb");
    fwrite(out, 4, n_out, o);
    fclose(o);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    free(profile); free(context); free(out);
    return status;
}
