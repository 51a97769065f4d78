#include "el_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

void el_pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

int el_str_is(const msgpack_object *o, const char *s) {
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

const msgpack_object *el_map_get(const msgpack_object *map, const char *key) {
    if (!map || map->type != MSGPACK_OBJECT_MAP) return NULL;
    for (uint32_t i = 0; i < map->via.map.size; i++)
        if (el_str_is(&map->via.map.ptr[i].key, key)) return &map->via.map.ptr[i].val;
    return NULL;
}

static int as_int(const msgpack_object *o, int64_t *out) {
    if (!o) return -1;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > INT64_MAX) return -1;
        *out = (int64_t)o->via.u64;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) { *out = o->via.i64; return 0; }
    return -1;
}

int el_get_int(const msgpack_object *map, const char *key, int64_t *out) { return as_int(el_map_get(map, key), out); }

int el_get_double(const msgpack_object *map, const char *key, double *out) {
    const msgpack_object *o = el_map_get(map, key);
    int64_t i;
    if (o && (o->type == MSGPACK_OBJECT_FLOAT64 || o->type == MSGPACK_OBJECT_FLOAT32)) { *out = o->via.f64; return 0; }
    if (as_int(o, &i) == 0) { *out = (double)i; return 0; }
    return -1;
}

int el_get_str(const msgpack_object *map, const char *key, char *out, size_t size) {
    const msgpack_object *o = el_map_get(map, key);
    if (!o || o->type != MSGPACK_OBJECT_STR || o->via.str.size >= size) return -1;
    memcpy(out, o->via.str.ptr, o->via.str.size);
    out[o->via.str.size] = 0;
    return 0;
}

int el_get_version(const msgpack_object *map, const char *key, int64_t *incarnation, int64_t *count) {
    const msgpack_object *o = el_map_get(map, key);
    if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 2) return -1;
    return as_int(&o->via.array.ptr[0], incarnation) || as_int(&o->via.array.ptr[1], count) ? -1 : 0;
}

static size_t aligned(size_t offset) { return (offset + 7) / 8 * 8; }

int el_encode(el_frames *out, int protocol, const char *kind, el_fields_writer write_fields, const void *arg,
              const el_array *arrays, int narrays) {
    if (narrays > EL_MAX_ARRAYS) return -1;
    int packed[EL_MAX_ARRAYS] = {0}, small = 0;
    for (int i = 0; i < narrays; i++)
        if (arrays[i].nbytes < EL_PACK_BELOW) small++;
    int pack = protocol >= 2 && small >= 2;
    for (int i = 0; i < narrays; i++) packed[i] = pack && arrays[i].nbytes < EL_PACK_BELOW;

    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    el_pack_str(&pk, "p");
    msgpack_pack_int(&pk, protocol);
    el_pack_str(&pk, "k");
    el_pack_str(&pk, kind);
    el_pack_str(&pk, "f");
    if (write_fields) write_fields(&pk, arg);
    else msgpack_pack_map(&pk, 0);
    el_pack_str(&pk, "a");
    msgpack_pack_array(&pk, narrays);
    for (int i = 0; i < narrays; i++) {
        msgpack_pack_array(&pk, packed[i] ? 4 : 3);
        el_pack_str(&pk, arrays[i].name);
        el_pack_str(&pk, arrays[i].dtype);
        msgpack_pack_array(&pk, arrays[i].ndim);
        for (int d = 0; d < arrays[i].ndim; d++) msgpack_pack_int64(&pk, arrays[i].shape[d]);
        if (packed[i]) el_pack_str(&pk, "packed");
    }
    out->frames = 0;
    out->data[out->frames] = sb.data; /* the sbuffer's malloc'd bytes: ours now */
    out->size[out->frames++] = sb.size;
    size_t shared = 0;
    for (int i = 0; i < narrays; i++) {
        if (packed[i]) { shared = aligned(shared) + arrays[i].nbytes; continue; }
        void *copy = malloc(arrays[i].nbytes ? arrays[i].nbytes : 1);
        memcpy(copy, arrays[i].data, arrays[i].nbytes);
        out->data[out->frames] = copy;
        out->size[out->frames++] = arrays[i].nbytes;
    }
    if (pack) {
        uint8_t *buf = calloc(1, shared ? shared : 1);
        size_t at = 0;
        for (int i = 0; i < narrays; i++) {
            if (!packed[i]) continue;
            at = aligned(at);
            memcpy(buf + at, arrays[i].data, arrays[i].nbytes);
            at += arrays[i].nbytes;
        }
        out->data[out->frames] = buf;
        out->size[out->frames++] = shared;
    }
    return 0;
}

void el_frames_free(el_frames *f) {
    for (int i = 0; i < f->frames; i++) free(f->data[i]);
    f->frames = 0;
}

size_t el_frames_bytes(const el_frames *f) {
    size_t n = 0;
    for (int i = 0; i < f->frames; i++) n += f->size[i];
    return n;
}

int el_send(void *socket, const el_frames *f) {
    /* ZeroMQ queues a multipart message whole or not at all once the first part is accepted;
     * with IMMEDIATE and no connection the first part fails with EAGAIN. */
    for (int i = 0; i < f->frames; i++) {
        int flags = ZMQ_DONTWAIT | (i + 1 < f->frames ? ZMQ_SNDMORE : 0);
        if (zmq_send(socket, f->data[i], f->size[i], flags) < 0) return -1;
    }
    return 0;
}

/* The wire's dtype names (hal/dtypes.py), their sizes and numpy's dtype.str (the weights checksum
 * hashes it; NULL where numpy has none of its own). */
static const struct { const char *name; size_t size; const char *numpy; } DTYPES[] = {
    {"float32", 4, "<f4"}, {"float64", 8, "<f8"}, {"int64", 8, "<i8"}, {"int32", 4, "<i4"}, {"uint8", 1, "|u1"},
    {"bool", 1, "|b1"}, {"int8", 1, "|i1"}, {"int16", 2, "<i2"}, {"uint16", 2, "<u2"}, {"uint32", 4, "<u4"},
    {"uint64", 8, "<u8"}, {"float16", 2, "<f2"}, {"bfloat16", 2, NULL}};

const char *el_dtype_numpy(const char *name) {
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
        if (strcmp(DTYPES[i].name, name) == 0) return DTYPES[i].numpy;
    return NULL;
}

static size_t dtype_size(const msgpack_object *o, const char **name) {
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
        if (el_str_is(o, DTYPES[i].name)) { *name = DTYPES[i].name; return DTYPES[i].size; }
    return 0;
}

void el_message_free(el_message *msg) {
    zmq_msg_t *frames = msg->frame_msgs;
    for (int i = 0; i < msg->nframes; i++) zmq_msg_close(&frames[i]);
    free(frames);
    msg->frame_msgs = NULL;
    msg->nframes = 0;
    msgpack_unpacked_destroy(&msg->header);
}

static int refuse(char *why, size_t size, const char *text) {
    snprintf(why, size, "%s", text);
    return -1;
}

int el_receive(void *socket, el_message *msg, char *why, size_t why_size) {
    memset(msg, 0, sizeof *msg);
    msgpack_unpacked_init(&msg->header);
    zmq_msg_t *frames = calloc(EL_MAX_ARRAYS + 1, sizeof(zmq_msg_t));
    msg->frame_msgs = frames;
    int more = 1, overflow = 0;
    while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, socket, msg->nframes == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(&part);
            return msg->nframes == 0 ? 0 : refuse(why, why_size, "truncated message");
        }
        more = zmq_msg_more(&part);
        if (msg->nframes <= EL_MAX_ARRAYS) frames[msg->nframes++] = part;
        else { zmq_msg_close(&part); overflow = 1; }
    }
    if (overflow) return refuse(why, why_size, "too many frames");
    size_t hsize = zmq_msg_size(&frames[0]);
    if (hsize > EL_MAX_HEADER) return refuse(why, why_size, "header too large");
    if (msgpack_unpack_next(&msg->header, zmq_msg_data(&frames[0]), hsize, NULL) != MSGPACK_UNPACK_SUCCESS)
        return refuse(why, why_size, "header is not msgpack");
    const msgpack_object *root = &msg->header.data;
    int64_t protocol;
    const msgpack_object *kind = el_map_get(root, "k"), *arrays = el_map_get(root, "a");
    msg->fields = el_map_get(root, "f");
    if (el_get_int(root, "p", &protocol) || (protocol != 1 && protocol != 2) || !kind ||
        kind->type != MSGPACK_OBJECT_STR || kind->via.str.size >= sizeof msg->kind || !msg->fields ||
        msg->fields->type != MSGPACK_OBJECT_MAP || !arrays || arrays->type != MSGPACK_OBJECT_ARRAY)
        return refuse(why, why_size, "header is not {p, k, f, a}");
    msg->protocol = (int)protocol;
    memcpy(msg->kind, kind->via.str.ptr, kind->via.str.size);
    if (arrays->via.array.size > EL_MAX_ARRAYS) return refuse(why, why_size, "too many arrays");
    msg->narrays = (int)arrays->via.array.size;
    int packed_count = 0, own = 1;
    for (int i = 0; i < msg->narrays; i++) {
        const msgpack_object *d = &arrays->via.array.ptr[i];
        if (d->type != MSGPACK_OBJECT_ARRAY || d->via.array.size < 3 || d->via.array.size > 4)
            return refuse(why, why_size, "array descriptor malformed");
        const msgpack_object *name = &d->via.array.ptr[0], *shape = &d->via.array.ptr[2];
        el_array *a = &msg->arrays[i];
        size_t item = dtype_size(&d->via.array.ptr[1], &a->dtype);
        if (name->type != MSGPACK_OBJECT_STR || name->via.str.size == 0 || name->via.str.size >= sizeof a->name ||
            !item || shape->type != MSGPACK_OBJECT_ARRAY || shape->via.array.size > EL_MAX_NDIM)
            return refuse(why, why_size, "array descriptor malformed");
        if (d->via.array.size == 4) {
            if (!el_str_is(&d->via.array.ptr[3], "packed")) return refuse(why, why_size, "compressed arrays unsupported");
            packed_count++;
        }
        memcpy(a->name, name->via.str.ptr, name->via.str.size);
        a->ndim = (int)shape->via.array.size;
        size_t n = item;
        for (int k = 0; k < a->ndim; k++) {
            int64_t dim;
            if (as_int(&shape->via.array.ptr[k], &dim) || dim < 0 || dim > (1 << 28))
                return refuse(why, why_size, "bad dimension");
            a->shape[k] = dim;
            n *= (size_t)dim;
            if (n > ((size_t)1 << 30)) return refuse(why, why_size, "array too large");
        }
        a->nbytes = n;
    }
    int expected = msg->narrays - packed_count + (packed_count > 0);
    if (expected != msg->nframes - 1) return refuse(why, why_size, "frame count differs from the header");
    size_t shared_end = 0;
    const uint8_t *shared = packed_count ? zmq_msg_data(&frames[msg->nframes - 1]) : NULL;
    size_t shared_size = packed_count ? zmq_msg_size(&frames[msg->nframes - 1]) : 0;
    for (int i = 0; i < msg->narrays; i++) {
        el_array *a = &msg->arrays[i];
        const msgpack_object *d = &arrays->via.array.ptr[i];
        if (d->via.array.size == 4) {
            size_t start = aligned(shared_end);
            shared_end = start + a->nbytes;
            if (shared_end > shared_size) return refuse(why, why_size, "packed frame too short");
            a->data = shared + start;
            continue;
        }
        if (zmq_msg_size(&frames[own]) != a->nbytes) return refuse(why, why_size, "frame size differs from its array");
        a->data = zmq_msg_data(&frames[own++]);
    }
    if (packed_count && shared_end != shared_size) return refuse(why, why_size, "packed frame size differs");
    return 1;
}

const el_array *el_message_array(const el_message *msg, const char *name) {
    for (int i = 0; i < msg->narrays; i++)
        if (strcmp(msg->arrays[i].name, name) == 0) return &msg->arrays[i];
    return NULL;
}
