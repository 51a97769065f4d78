/* The repository's wire in C: a msgpack header {"p", "k", "f", "a"} and raw little-endian array
 * frames (hal/wire/codec.py), small arrays possibly packed into one last frame at 8-byte aligned
 * offsets. Only what a coupled model's rank sends and reads. */
#ifndef EL_WIRE_H
#define EL_WIRE_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

enum { EL_MAX_ARRAYS = 32, EL_MAX_NDIM = 4, EL_PACK_BELOW = 64 * 1024, EL_MAX_HEADER = 64 * 1024 };

typedef struct {
    char name[64];
    const char *dtype;       /* "float32", "int64", ... */
    int ndim;
    int64_t shape[EL_MAX_NDIM];
    const void *data;        /* little-endian bytes */
    size_t nbytes;
} el_array;

/* A message to send: the header's bytes and its frames (each malloc'd, owned). */
typedef struct {
    int frames;
    void *data[EL_MAX_ARRAYS + 1];
    size_t size[EL_MAX_ARRAYS + 1];
} el_frames;

/* One received message: the header parsed, the arrays as views of the received frames. */
typedef struct {
    msgpack_unpacked header;
    const msgpack_object *fields;
    char kind[16];
    int protocol;
    int narrays;
    el_array arrays[EL_MAX_ARRAYS];
    int nframes;
    void *frame_msgs;        /* zmq_msg_t[nframes], owned */
} el_message;

/* Encode: the fields are written by `write_fields` (a map) into the header; arrays below
 * EL_PACK_BELOW share one packed frame when there are two or more (protocol 2). */
typedef void (*el_fields_writer)(msgpack_packer *pk, const void *arg);
int el_encode(el_frames *out, int protocol, const char *kind, el_fields_writer write_fields, const void *arg,
              const el_array *arrays, int narrays);
void el_frames_free(el_frames *f);
size_t el_frames_bytes(const el_frames *f);

/* Send every frame without blocking (ZMQ_DONTWAIT); 0 on success, -1 when the socket would block. */
int el_send(void *socket, const el_frames *f);
/* Receive one message if one is waiting; 1: got one, 0: none, -1: malformed (reason in `why`). */
int el_receive(void *socket, el_message *msg, char *why, size_t why_size);
void el_message_free(el_message *msg);
const el_array *el_message_array(const el_message *msg, const char *name);

/* numpy's dtype.str of a wire dtype name ("<f4" for "float32"), NULL if it has none. */
const char *el_dtype_numpy(const char *name);

/* msgpack helpers */
void el_pack_str(msgpack_packer *pk, const char *s);
const msgpack_object *el_map_get(const msgpack_object *map, const char *key);
int el_get_int(const msgpack_object *map, const char *key, int64_t *out);
int el_get_double(const msgpack_object *map, const char *key, double *out);
int el_get_str(const msgpack_object *map, const char *key, char *out, size_t size);
int el_get_version(const msgpack_object *map, const char *key, int64_t *incarnation, int64_t *count);
int el_str_is(const msgpack_object *o, const char *s);

#endif
