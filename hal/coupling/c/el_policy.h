/* The coupling policy in C: the per-level network of an embodyrl policy export (the .msgpack
 * written beside policy.json/.npz by embodyrl.hal.runtime.save(..., packed=True)), its forward
 * pass (concat -> dense / relu / tanh ... -> scale, as hal/runtime.py), and the learner's
 * published weights taken into it after their checksum (hal/wire/weights.py) is checked. */
#ifndef EL_POLICY_H
#define EL_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "el_wire.h"

enum { EL_MAX_TENSORS = 32, EL_MAX_OPS = 32 };

typedef struct {
    char name[64];
    int ndim;
    int64_t shape[2];
    float *data;
    size_t size;
} el_tensor;

typedef enum { EL_DENSE, EL_RELU, EL_TANH, EL_SCALE } el_opcode;

typedef struct {
    el_opcode code;
    int first, second; /* dense: kernel, bias; scale: center, half_range (tensor indices) */
} el_op;

typedef struct {
    int nops, ntensors;
    el_op ops[EL_MAX_OPS];
    el_tensor tensors[EL_MAX_TENSORS];
    int in_width, max_width;
    double exploration_std;   /* in half action ranges */
    float minimum, maximum;   /* the action's bounds */
    int64_t incarnation, count;
} el_policy;

/* Read an export; 0, or -1 with the reason in `why`. `window` and `bound`: what the link expects
 * (the policy must read `window` values and act within [-bound, bound]). */
int el_policy_load(el_policy *p, const char *path, int window, float bound, char *why, size_t why_size);
void el_policy_free(el_policy *p);
/* out[r] for each of the n rows of x [n][in_width]; `scratch` holds 2 * block * max_width floats. */
void el_policy_forward(const el_policy *p, int n, const float *x, float *out, float *scratch, int block);
/* Take a WEIGHTS message's full arrays: every actor/ tensor the graph reads must be there, float32,
 * of its shape, and the checksum of all of them must match; nothing changes otherwise.
 * 0, or -1 with the reason in `why`. */
int el_policy_take(el_policy *p, const el_message *weights, char *why, size_t why_size);
/* hal/wire/weights.checksum of a message's arrays, as 32 hex digits (+ NUL). */
int el_checksum(const el_message *msg, char out[33]);

#endif
