/* HighwayHash-64, the portable algorithm (google/highwayhash c/highwayhash.c), written
 * anew for exporter/profiles/highwayhash.py: a streaming hasher type,
 * HighwayHash64(k0, k1, k2, k3) with update(buffer) and digest() -> int. The pure-Python
 * twin in highwayhash.py is the reference; both are held to HighwayHash's published
 * test vectors (tests/unit/test_highwayhash.py). CPython's C API only.
 *
 * Why compiled: Riegeli/records hashes every chunk's data, so a reader verifying a
 * capture hashes every byte of the file; Python ints manage about 4 MB/s. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint64_t v0[4], v1[4], mul0[4], mul1[4];
} hh_state;

typedef struct {
    PyObject_HEAD
    hh_state state;
    uint8_t pending[32]; /* the bytes of an incomplete packet */
    int num_pending;
} HHObject;

static uint64_t read64(const uint8_t *p) {
    return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) |
           ((uint64_t)p[3] << 24) | ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40) |
           ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
}

static uint64_t swap_halves(uint64_t x) { return (x >> 32) | (x << 32); }

static void hh_reset(hh_state *s, const uint64_t key[4]) {
    static const uint64_t init0[4] = {0xdbe6d5d5fe4cce2fULL, 0xa4093822299f31d0ULL,
                                      0x13198a2e03707344ULL, 0x243f6a8885a308d3ULL};
    static const uint64_t init1[4] = {0x3bd39e10cb0ef593ULL, 0xc0acf169b5f18a8cULL,
                                      0xbe5466cf34e90c6cULL, 0x452821e638d01377ULL};
    for (int i = 0; i < 4; i++) {
        s->mul0[i] = init0[i];
        s->mul1[i] = init1[i];
        s->v0[i] = init0[i] ^ key[i];
        s->v1[i] = init1[i] ^ swap_halves(key[i]);
    }
}

/* ZipperMergeAndAdd: byte shuffles of (v1, v0) added to (add1, add0). */
static void zipper(uint64_t v1, uint64_t v0, uint64_t *add1, uint64_t *add0) {
    *add0 += (((v0 & 0xff000000ULL) | (v1 & 0xff00000000ULL)) >> 24) |
             (((v0 & 0xff0000000000ULL) | (v1 & 0xff000000000000ULL)) >> 16) |
             (v0 & 0xff0000ULL) | ((v0 & 0xff00ULL) << 32) |
             ((v1 & 0xff00000000000000ULL) >> 8) | (v0 << 56);
    *add1 += (((v1 & 0xff000000ULL) | (v0 & 0xff00000000ULL)) >> 24) | (v1 & 0xff0000ULL) |
             ((v1 & 0xff0000000000ULL) >> 16) | ((v1 & 0xff00ULL) << 24) |
             ((v0 & 0xff000000000000ULL) >> 8) | ((v1 & 0xffULL) << 48) |
             (v0 & 0xff00000000000000ULL);
}

static void hh_update(hh_state *s, const uint64_t lanes[4]) {
    for (int i = 0; i < 4; i++) {
        s->v1[i] += s->mul0[i] + lanes[i];
        s->mul0[i] ^= (s->v1[i] & 0xffffffffULL) * (s->v0[i] >> 32);
        s->v0[i] += s->mul1[i];
        s->mul1[i] ^= (s->v0[i] & 0xffffffffULL) * (s->v1[i] >> 32);
    }
    zipper(s->v1[1], s->v1[0], &s->v0[1], &s->v0[0]);
    zipper(s->v1[3], s->v1[2], &s->v0[3], &s->v0[2]);
    zipper(s->v0[1], s->v0[0], &s->v1[1], &s->v1[0]);
    zipper(s->v0[3], s->v0[2], &s->v1[3], &s->v1[2]);
}

static void hh_packet(hh_state *s, const uint8_t *p) {
    uint64_t lanes[4] = {read64(p), read64(p + 8), read64(p + 16), read64(p + 24)};
    hh_update(s, lanes);
}

/* UpdateRemainder: the last 1..31 bytes, with their count folded into the state. */
static void hh_remainder(hh_state *s, const uint8_t *bytes, size_t size) {
    size_t size_mod4 = size & 3, aligned = size & ~(size_t)3;
    uint8_t packet[32] = {0};
    for (int i = 0; i < 4; i++) {
        s->v0[i] += ((uint64_t)size << 32) + size;
        uint32_t lo = (uint32_t)s->v1[i], hi = (uint32_t)(s->v1[i] >> 32);
        /* size is 1..31 here, so neither shift is by 32 */
        lo = (lo << size) | (lo >> (32 - size));
        hi = (hi << size) | (hi >> (32 - size));
        s->v1[i] = ((uint64_t)hi << 32) | lo;
    }
    memcpy(packet, bytes, aligned);
    if (size & 16) {
        memcpy(packet + 28, bytes + aligned + size_mod4 - 4, 4);
    } else if (size_mod4) {
        packet[16] = bytes[aligned];
        packet[17] = bytes[aligned + (size_mod4 >> 1)];
        packet[18] = bytes[aligned + size_mod4 - 1];
    }
    hh_packet(s, packet);
}

static int HH_init(HHObject *self, PyObject *args, PyObject *kwds) {
    unsigned long long k[4];
    static char *names[] = {"k0", "k1", "k2", "k3", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KKKK", names, &k[0], &k[1], &k[2], &k[3]))
        return -1;
    uint64_t key[4] = {k[0], k[1], k[2], k[3]};
    hh_reset(&self->state, key);
    self->num_pending = 0;
    return 0;
}

static PyObject *HH_update(HHObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = (const uint8_t *)view.buf;
    size_t n = (size_t)view.len;
    /* Large buffers hash without the GIL: the reader may run beside other threads. */
    Py_BEGIN_ALLOW_THREADS
    if (self->num_pending) {
        size_t take = 32 - (size_t)self->num_pending;
        if (take > n) take = n;
        memcpy(self->pending + self->num_pending, p, take);
        self->num_pending += (int)take;
        p += take;
        n -= take;
        if (self->num_pending == 32) {
            hh_packet(&self->state, self->pending);
            self->num_pending = 0;
        }
    }
    for (; n >= 32; n -= 32, p += 32) hh_packet(&self->state, p);
    if (n) {
        memcpy(self->pending, p, n);
        self->num_pending = (int)n;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *HH_digest(HHObject *self, PyObject *Py_UNUSED(ignored)) {
    hh_state s = self->state; /* a copy: digest() leaves the hasher as it was */
    if (self->num_pending) hh_remainder(&s, self->pending, (size_t)self->num_pending);
    for (int round = 0; round < 4; round++) {
        uint64_t permuted[4] = {swap_halves(s.v0[2]), swap_halves(s.v0[3]),
                                swap_halves(s.v0[0]), swap_halves(s.v0[1])};
        hh_update(&s, permuted);
    }
    return PyLong_FromUnsignedLongLong(s.v0[0] + s.v1[0] + s.mul0[0] + s.mul1[0]);
}

static PyMethodDef HH_methods[] = {
    {"update", (PyCFunction)HH_update, METH_O, "Hash the bytes of a buffer."},
    {"digest", (PyCFunction)HH_digest, METH_NOARGS, "The 64-bit hash so far."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HHType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "exporter.profiles._highwayhash.HighwayHash64",
    .tp_basicsize = sizeof(HHObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Streaming HighwayHash-64: HighwayHash64(k0, k1, k2, k3).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)HH_init,
    .tp_methods = HH_methods,
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_highwayhash",
    .m_doc = "HighwayHash-64 (portable algorithm).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__highwayhash(void) {
    if (PyType_Ready(&HHType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&HHType);
    if (PyModule_AddObject(m, "HighwayHash64", (PyObject *)&HHType) < 0) {
        Py_DECREF(&HHType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
