#include "el_policy.h"

#include <cblas.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *why, size_t size, const char *text, const char *name) {
    snprintf(why, size, "%s%s%s", name ? name : "", name ? ": " : "", text);
    return -1;
}

static int find(const el_policy *p, const char *name) {
    for (int i = 0; i < p->ntensors; i++)
        if (strcmp(p->tensors[i].name, name) == 0) return i;
    return -1;
}

static int op_tensor(el_policy *p, const msgpack_object *op, const char *role, int *index, char *why, size_t ws) {
    const msgpack_object *name = el_map_get(op, role);
    char text[64];
    if (!name || name->type != MSGPACK_OBJECT_STR || name->via.str.size >= sizeof text)
        return fail(why, ws, "op lacks an array name", role);
    memcpy(text, name->via.str.ptr, name->via.str.size);
    text[name->via.str.size] = 0;
    *index = find(p, text);
    return *index < 0 ? fail(why, ws, "the export lacks this array", text) : 0;
}

static int read_arrays(el_policy *p, const msgpack_object *arrays, char *why, size_t ws) {
    if (!arrays || arrays->type != MSGPACK_OBJECT_MAP || arrays->via.map.size > EL_MAX_TENSORS)
        return fail(why, ws, "the export's arrays are not a map of at most 32", NULL);
    for (uint32_t i = 0; i < arrays->via.map.size; i++) {
        const msgpack_object *key = &arrays->via.map.ptr[i].key, *val = &arrays->via.map.ptr[i].val;
        el_tensor *t = &p->tensors[p->ntensors];
        if (key->type != MSGPACK_OBJECT_STR || key->via.str.size >= sizeof t->name)
            return fail(why, ws, "array name too long", NULL);
        memcpy(t->name, key->via.str.ptr, key->via.str.size);
        t->name[key->via.str.size] = 0;
        const msgpack_object *shape = el_map_get(val, "shape"), *data = el_map_get(val, "data");
        if (!el_str_is(el_map_get(val, "dtype"), "float32") || !shape || shape->type != MSGPACK_OBJECT_ARRAY ||
            shape->via.array.size > 2 || !data || data->type != MSGPACK_OBJECT_BIN)
            return fail(why, ws, "not a float32 array of at most 2 dimensions", t->name);
        t->ndim = (int)shape->via.array.size;
        t->size = 1;
        for (int d = 0; d < t->ndim; d++) {
            const msgpack_object *dim = &shape->via.array.ptr[d];
            if (dim->type != MSGPACK_OBJECT_POSITIVE_INTEGER || dim->via.u64 > (1u << 24))
                return fail(why, ws, "bad dimension", t->name);
            t->shape[d] = (int64_t)dim->via.u64;
            t->size *= (size_t)dim->via.u64;
        }
        if (data->via.bin.size != 4 * t->size) return fail(why, ws, "data size differs from its shape", t->name);
        t->data = malloc(4 * t->size + 4);
        memcpy(t->data, data->via.bin.ptr, 4 * t->size);
        p->ntensors++;
        for (size_t k = 0; k < t->size; k++)
            if (!isfinite(t->data[k])) return fail(why, ws, "non-finite values", t->name);
    }
    return 0;
}

static int read_graph(el_policy *p, const msgpack_object *graph, int window, float bound, char *why, size_t ws) {
    const msgpack_object *fmt = el_map_get(graph, "format"), *ops = el_map_get(graph, "graph");
    int64_t version;
    if (!el_str_is(fmt, "embodyrl.policy") || el_get_int(graph, "format_version", &version) || version != 1)
        return fail(why, ws, "not an embodyrl.policy v1 export", NULL);
    if (el_get_version(graph, "policy_version", &p->incarnation, &p->count)) p->incarnation = 0, p->count = -1;
    const msgpack_object *exploration = el_map_get(graph, "exploration"), *action = el_map_get(graph, "action_spec");
    p->exploration_std = 0;
    if (exploration) {
        if (!el_str_is(el_map_get(exploration, "kind"), "gaussian"))
            return fail(why, ws, "exploration must be gaussian (a DDPG coupling policy)", NULL);
        el_get_double(exploration, "std", &p->exploration_std);
    }
    double lo, hi;
    if (el_get_double(action, "minimum", &lo) || el_get_double(action, "maximum", &hi))
        return fail(why, ws, "the action spec has no scalar bounds", NULL);
    p->minimum = (float)lo, p->maximum = (float)hi;
    if (fabsf(p->maximum - bound) > 1e-6f * (1 + bound) || fabsf(p->minimum + bound) > 1e-6f * (1 + bound))
        return fail(why, ws, "the policy's action bounds differ from max_correction", NULL);
    if (!ops || ops->type != MSGPACK_OBJECT_ARRAY || ops->via.array.size < 2 || ops->via.array.size > EL_MAX_OPS + 1)
        return fail(why, ws, "the graph is not a list of ops", NULL);
    const msgpack_object *first = &ops->via.array.ptr[0], *fields = el_map_get(first, "fields");
    if (!el_str_is(el_map_get(first, "op"), "concat") || !fields || fields->type != MSGPACK_OBJECT_ARRAY ||
        fields->via.array.size != 1 || !el_str_is(&fields->via.array.ptr[0], "window"))
        return fail(why, ws, "the graph must start with concat of the field window (a coupling policy)", NULL);
    int width = window;
    p->in_width = p->max_width = window;
    for (uint32_t i = 1; i < ops->via.array.size; i++) {
        const msgpack_object *op = &ops->via.array.ptr[i], *kind = el_map_get(op, "op");
        el_op *o = &p->ops[p->nops++];
        if (el_str_is(kind, "dense")) {
            o->code = EL_DENSE;
            if (op_tensor(p, op, "kernel", &o->first, why, ws) || op_tensor(p, op, "bias", &o->second, why, ws))
                return -1;
            const el_tensor *k = &p->tensors[o->first], *b = &p->tensors[o->second];
            if (k->ndim != 2 || k->shape[0] != width || b->ndim != 1 || b->shape[0] != k->shape[1])
                return fail(why, ws, "kernel and bias do not take the width so far", k->name);
            width = (int)k->shape[1];
            if (width > p->max_width) p->max_width = width;
        } else if (el_str_is(kind, "relu")) {
            o->code = EL_RELU;
        } else if (el_str_is(kind, "tanh")) {
            o->code = EL_TANH;
        } else if (el_str_is(kind, "scale")) {
            o->code = EL_SCALE;
            if (op_tensor(p, op, "center", &o->first, why, ws) || op_tensor(p, op, "half_range", &o->second, why, ws))
                return -1;
            if (p->tensors[o->first].size != 1 || p->tensors[o->second].size != 1)
                return fail(why, ws, "scale of a per-level policy has one center and half range", NULL);
        } else {
            return fail(why, ws, "op not supported in C (dense, relu, tanh, scale are)", NULL);
        }
    }
    return width == 1 ? 0 : fail(why, ws, "the graph must end on one value per level", NULL);
}

int el_policy_load(el_policy *p, const char *path, int window, float bound, char *why, size_t ws) {
    memset(p, 0, sizeof *p);
    FILE *f = fopen(path, "rb");
    if (!f) return fail(why, ws, "cannot open", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *bytes = size > 0 && size < (1L << 30) ? malloc((size_t)size) : NULL;
    int ok = bytes && fread(bytes, 1, (size_t)size, f) == (size_t)size;
    fclose(f);
    if (!ok) { free(bytes); return fail(why, ws, "cannot read", path); }
    msgpack_unpacked root;
    msgpack_unpacked_init(&root);
    int status = msgpack_unpack_next(&root, bytes, (size_t)size, NULL) == MSGPACK_UNPACK_SUCCESS ? 0
                 : fail(why, ws, "not msgpack", path);
    if (status == 0) status = read_arrays(p, el_map_get(&root.data, "arrays"), why, ws);
    if (status == 0) status = read_graph(p, el_map_get(&root.data, "graph"), window, bound, why, ws);
    msgpack_unpacked_destroy(&root);
    free(bytes);
    if (status) el_policy_free(p);
    return status;
}

void el_policy_free(el_policy *p) {
    for (int i = 0; i < p->ntensors; i++) free(p->tensors[i].data);
    p->ntensors = p->nops = 0;
}

/* y[r][j] = bias[j] + sum_q x[r][q] k[q][j]: the bias rows, then one BLAS sgemm adding x k to them
 * (the machine's BLAS: plain loops reached a quarter of OpenBLAS's speed on these shapes). */
static void dense(const float *x, int x_stride, int rows, int width, const float *k, const float *bias, int outw,
                  float *y, int y_stride) {
    for (int r = 0; r < rows; r++) memcpy(y + (size_t)r * y_stride, bias, sizeof(float) * outw);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, outw, width, 1.0f, x, x_stride, k, outw, 1.0f, y,
                y_stride);
}

void el_policy_forward(const el_policy *p, int n, const float *x, float *out, float *scratch, int block) {
    const int wmax = p->max_width;
    float *a = scratch, *b = scratch + (size_t)block * wmax;
    for (int lo = 0; lo < n; lo += block) {
        int rows = n - lo < block ? n - lo : block, width = p->in_width;
        const float *in = x + (size_t)lo * p->in_width;
        int in_stride = p->in_width;
        float *cur = NULL;
        for (int i = 0; i < p->nops; i++) {
            const el_op *o = &p->ops[i];
            if (o->code == EL_DENSE) {
                const el_tensor *k = &p->tensors[o->first], *bias = &p->tensors[o->second];
                int outw = (int)k->shape[1];
                float *dst = cur == a ? b : a;
                dense(in, in_stride, rows, width, k->data, bias->data, outw, dst, wmax);
                cur = dst, in = dst, in_stride = wmax, width = outw;
            } else if (o->code == EL_RELU) {
                for (int r = 0; r < rows; r++) { /* a compare, not fmaxf: a call per value, never vectorised */
                    float *v = cur + (size_t)r * wmax;
                    for (int j = 0; j < width; j++) v[j] = v[j] > 0.f ? v[j] : 0.f;
                }
            } else if (o->code == EL_TANH) {
                for (int r = 0; r < rows; r++)
                    for (int j = 0; j < width; j++) cur[(size_t)r * wmax + j] = tanhf(cur[(size_t)r * wmax + j]);
            } else {
                const float center = p->tensors[o->first].data[0], half = p->tensors[o->second].data[0];
                for (int r = 0; r < rows; r++) cur[(size_t)r * wmax] = cur[(size_t)r * wmax] * half + center;
            }
        }
        for (int r = 0; r < rows; r++) out[lo + r] = cur[(size_t)r * wmax];
    }
}

static int by_name(const void *x, const void *y) {
    return strcmp((*(const el_array *const *)x)->name, (*(const el_array *const *)y)->name);
}

int el_checksum(const el_message *msg, char out[33]) {
    const el_array *sorted[EL_MAX_ARRAYS];
    for (int i = 0; i < msg->narrays; i++) sorted[i] = &msg->arrays[i];
    qsort(sorted, (size_t)msg->narrays, sizeof sorted[0], by_name);
    crypto_generichash_state state;
    unsigned char digest[16];
    crypto_generichash_init(&state, NULL, 0, sizeof digest);
    for (int i = 0; i < msg->narrays; i++) {
        const el_array *a = sorted[i];
        const char *str = el_dtype_numpy(a->dtype);
        if (!str) return -1;
        char text[160], shape[96] = "(";
        for (int d = 0; d < a->ndim; d++) {
            char dim[24];
            snprintf(dim, sizeof dim, d ? ", %lld" : "%lld", (long long)a->shape[d]);
            strncat(shape, dim, sizeof shape - strlen(shape) - 1);
        }
        strncat(shape, a->ndim == 1 ? ",)" : ")", sizeof shape - strlen(shape) - 1);
        int n = snprintf(text, sizeof text, "%s|%s|%s", a->name, str, shape);
        crypto_generichash_update(&state, (const unsigned char *)text, (unsigned long long)n);
        crypto_generichash_update(&state, a->data, a->nbytes);
    }
    crypto_generichash_final(&state, digest, sizeof digest);
    sodium_bin2hex(out, 33, digest, sizeof digest);
    return 0;
}

int el_policy_take(el_policy *p, const el_message *weights, char *why, size_t ws) {
    char encoding[16], checksum[40], ours[33];
    int64_t incarnation, count;
    if (el_get_str(weights->fields, "encoding", encoding, sizeof encoding) || strcmp(encoding, "full") != 0)
        return fail(why, ws, "only full weights are taken (the HELLO said so)", NULL);
    if (el_get_version(weights->fields, "version", &incarnation, &count))
        return fail(why, ws, "WEIGHTS without a version", NULL);
    if (el_get_str(weights->fields, "checksum", checksum, sizeof checksum) || el_checksum(weights, ours) ||
        strcmp(checksum, ours) != 0)
        return fail(why, ws, "checksum mismatch", NULL);
    const el_array *found[EL_MAX_TENSORS] = {0};
    for (int i = 0; i < p->ntensors; i++) {
        const el_tensor *t = &p->tensors[i];
        if (strncmp(t->name, "actor/", 6) != 0) continue; /* the action scale stays the export's */
        const el_array *a = el_message_array(weights, t->name);
        if (!a) return fail(why, ws, "missing from the published weights", t->name);
        int same = strcmp(a->dtype, "float32") == 0 && a->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = a->shape[d] == t->shape[d];
        if (!same) return fail(why, ws, "published with another dtype or shape", t->name);
        const float *v = a->data;
        for (size_t k = 0; k < t->size; k++)
            if (!isfinite(v[k])) return fail(why, ws, "non-finite published values", t->name);
        found[i] = a;
    }
    for (int i = 0; i < p->ntensors; i++)
        if (found[i]) memcpy(p->tensors[i].data, found[i]->data, 4 * p->tensors[i].size);
    p->incarnation = incarnation, p->count = count;
    return 0;
}
