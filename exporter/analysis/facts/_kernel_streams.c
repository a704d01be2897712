/* The per-kernel passes of exporter/analysis/facts/gpu_kernels.py, compiled.
 *
 * The kernel facts read each GPU stream line's kernels as int64 columns (the compiled
 * core _xwire gives them with their stats). What is then done per kernel is here, one
 * pass each, where numpy took a dozen passes and as many temporary arrays:
 *
 *   stream()        a stream's kernels -> per-row duration and launch-latency sums, the
 *                   stream's busy intervals, its gaps and the launch waits in them
 *                   (gpu_kernels._stream_numpy is its twin);
 *   launch_calls()  a host line's piece -> the launch calls' correlation ids and start
 *                   ns (gpu_kernels._launch_piece_numpy is its twin).
 *
 * tests/unit/test_gpu_kernel_passes.py holds each to its twin on generated, fuzzed and
 * hostile columns. Arithmetic on times wraps as numpy's int64 does (unsigned here: a
 * signed overflow is undefined in C), and ns are picoseconds floor-divided by 1000, as
 * numpy's // divides.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PS_PER_NS 1000
#define FAR ((int64_t)1 << 62) /* exporter.profiles.nesting.FAR */
/* event_stats' stat kinds: the field number of the value */
#define KIND_UINT64 3
#define KIND_INT64 4
#define KIND_STR 5

static inline int64_t wrap_add(int64_t a, int64_t b) {
    return (int64_t)((uint64_t)a + (uint64_t)b);
}

static inline int64_t wrap_sub(int64_t a, int64_t b) {
    return (int64_t)((uint64_t)a - (uint64_t)b);
}

static inline int64_t floor_ns(int64_t ps) {
    int64_t q = ps / PS_PER_NS;
    return (ps % PS_PER_NS < 0) ? q - 1 : q;
}

/* n int64 values in a buffer; 0 with ValueError when its length is no multiple of 8. */
static int int64s(const Py_buffer *view, Py_ssize_t *n) {
    if (view->len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "an int64 array's bytes are a multiple of 8");
        return 0;
    }
    *n = view->len / 8;
    return 1;
}

/* The index of v in the sorted ids[0..n) (the first of equal ones), or -1. */
static inline Py_ssize_t search(const int64_t *ids, Py_ssize_t n, int64_t v) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (ids[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && ids[lo] == v ? lo : -1;
}

/* An exact sum of int64 values (fewer than 2**31 of them): the high halves (arithmetic
 * shift) and the low 32 bits summed apart, neither of which can overflow. */
typedef struct {
    int64_t high;
    uint64_t low;
} Sum;

static inline void sum_add(Sum *s, int64_t v) {
    s->high += v >> 32; /* arithmetic on every compiler CPython supports */
    s->low += (uint64_t)v & 0xFFFFFFFFu;
}

static PyObject *sum_long(const Sum *s) {
    int64_t scaled, total;
    if (!__builtin_mul_overflow(s->high, (int64_t)1 << 32, &scaled) && s->low <= INT64_MAX &&
        !__builtin_add_overflow(scaled, (int64_t)s->low, &total))
        return PyLong_FromLongLong(total);
    PyObject *high = PyLong_FromLongLong(s->high), *low = PyLong_FromUnsignedLongLong(s->low);
    PyObject *shift = PyLong_FromLong(32), *moved = NULL, *out = NULL;
    if (high && low && shift && (moved = PyNumber_Lshift(high, shift)))
        out = PyNumber_Add(moved, low);
    Py_XDECREF(high);
    Py_XDECREF(low);
    Py_XDECREF(shift);
    Py_XDECREF(moved);
    return out;
}

typedef struct {
    int64_t count, low, high;
    Sum total;
    int64_t latency_count, latency_high;
    Sum latency_total;
} Row;

/* A bytes object of room for cap int64 values, filled from the front and cut to size. */
typedef struct {
    PyObject *bytes;
    int64_t *at;
    Py_ssize_t n;
} Out;

static int out_open(Out *o, Py_ssize_t cap) {
    o->bytes = PyBytes_FromStringAndSize(NULL, cap * 8);
    o->at = o->bytes ? (int64_t *)PyBytes_AS_STRING(o->bytes) : NULL;
    o->n = 0;
    return o->bytes != NULL;
}

static int out_close(Out *o) { return _PyBytes_Resize(&o->bytes, o->n * 8) == 0; }

/* Where an id is among sorted ids (the first of equal ones): through ``table`` (the
 * index by id, -1 none: gpu_kernels._call_table, where the ids are dense) when given,
 * else by search. An entry past the ids (none in those tables) is none. */
typedef struct {
    const int64_t *table, *ids;
    Py_ssize_t table_n, ids_n;
} Lookup;

static inline Py_ssize_t lookup(const Lookup *l, int64_t v) {
    if (!l->table_n) return search(l->ids, l->ids_n, v);
    int64_t at = v >= 0 && v < l->table_n ? l->table[v] : -1;
    return at >= 0 && at < l->ids_n ? (Py_ssize_t)at : -1;
}

PyDoc_STRVAR(stream_doc,
"stream(pieces, base_ns, row_count, table, call_ids, call_starts, /)\n--\n\n"
"One stream's kernels, in ``pieces`` (a tuple of (rows, offsets, durations,\n"
"correlations) tuples of int64 buffers of equal length, read one after the other: each\n"
"kernel's row below ``row_count``, offset and duration in ps, correlation id) on a line\n"
"starting at ``base_ns``; its launch calls by correlation id through ``table`` (call\n"
"index by id, -1 none; empty: binary search of the sorted ``call_ids``) and their\n"
"``call_starts``. None when the kernels are not in start order (sort them, ask again);\n"
"else (rows, latencies, correlated, first_ns, last_ns, busy_starts, busy_ends,\n"
"wait_from, wait_to, gaps, launch_gaps): rows as (row, count, total, min, max) of\n"
"durations (ns), latencies as (row, count, total, max) of start - call start, rows\n"
"ascending; the rest int64 array bytes, as gpu_kernels._stream_numpy computes them.");

enum { PIECE_COLUMNS = 4 };

static PyObject *stream(PyObject *self, PyObject *args) {
    PyObject *pieces;
    Py_buffer views[3] = {{0}};
    long long base_ns;
    Py_ssize_t row_count;
    if (!PyArg_ParseTuple(args, "O!Lny*y*y*:stream", &PyTuple_Type, &pieces, &base_ns,
                          &row_count, &views[0], &views[1], &views[2]))
        return NULL;
    PyObject *result = NULL, *rows_out = NULL, *latency_out = NULL;
    Out outs[6] = {{0}};
    Row *per = NULL;
    Py_ssize_t parts = PyTuple_GET_SIZE(pieces), held = 0, n = 0, sizes[3];
    Py_buffer *pv = PyMem_Calloc(parts * PIECE_COLUMNS + 1, sizeof(Py_buffer));
    Py_ssize_t *lengths = PyMem_Calloc(parts + 1, sizeof(Py_ssize_t));
    if (!pv || !lengths) {
        PyErr_NoMemory();
        goto done;
    }
    for (int v = 0; v < 3; v++)
        if (!int64s(&views[v], &sizes[v])) goto done;
    for (Py_ssize_t p = 0; p < parts; p++) {
        PyObject *piece = PyTuple_GET_ITEM(pieces, p);
        if (!PyTuple_Check(piece) || PyTuple_GET_SIZE(piece) != PIECE_COLUMNS) {
            PyErr_SetString(PyExc_ValueError, "stream: a piece is a tuple of four columns");
            goto done;
        }
        for (int c = 0; c < PIECE_COLUMNS; c++) {
            Py_ssize_t length;
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(piece, c), &pv[held], PyBUF_C_CONTIGUOUS) < 0)
                goto done;
            if (!int64s(&pv[held++], &length)) goto done;
            if (c && length != lengths[p]) {
                PyErr_SetString(PyExc_ValueError, "stream: columns of unequal length");
                goto done;
            }
            lengths[p] = length;
        }
        n += lengths[p];
    }
    if (sizes[2] != sizes[1] || row_count < 0 || n >= (Py_ssize_t)1 << 31) {
        PyErr_SetString(PyExc_ValueError, "stream: calls of unequal length or too many kernels");
        goto done;
    }
    const int64_t *call_start = views[2].buf;
    Lookup calls = {views[0].buf, views[1].buf, sizes[0], sizes[1]};
    per = PyMem_Calloc(row_count ? row_count : 1, sizeof(Row));
    if (!per) {
        PyErr_NoMemory();
        goto done;
    }
    /* busy starts and ends (<= n), then per gap (<= n - 1): waits' from and to, gaps,
     * launch gaps */
    for (int o = 0; o < 6; o++)
        if (!out_open(&outs[o], o < 2 ? n : (n ? n - 1 : 0))) goto done;
    int64_t correlated = 0, first = 0, reach = 0, open_from = 0, previous = 0;
    int sorted = 1, bad_row = 0;
    Py_ssize_t seen = 0; /* kernels before this one */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t p = 0; p < parts && sorted && !bad_row; p++) {
        const Py_buffer *piece = pv + p * PIECE_COLUMNS;
        const int64_t *row = piece[0].buf, *off = piece[1].buf, *dur = piece[2].buf,
                      *corr = piece[3].buf;
        for (Py_ssize_t i = 0; i < lengths[p]; i++, seen++) {
            int64_t r = row[i];
            if (r < 0 || r >= row_count) {
                bad_row = 1;
                break;
            }
            int64_t d = floor_ns(dur[i]), start = wrap_add((int64_t)base_ns, floor_ns(off[i]));
            int64_t end = wrap_add(start, d);
            if (seen && start < previous) {
                sorted = 0;
                break;
            }
            previous = start;
            Row *k = &per[r];
            if (!k->count || d < k->low) k->low = d;
            if (!k->count || d > k->high) k->high = d;
            k->count++;
            sum_add(&k->total, d);
            /* The kernel's launch call, if found and not after the kernel started. */
            int64_t call = -1;
            Py_ssize_t at = corr[i] >= 0 ? lookup(&calls, corr[i]) : -1;
            if (at >= 0 && call_start[at] <= start) {
                call = call_start[at];
                int64_t latency = wrap_sub(start, call);
                if (!k->latency_count || latency > k->latency_high) k->latency_high = latency;
                k->latency_count++;
                sum_add(&k->latency_total, latency);
                correlated++;
            }
            if (!seen) {
                first = open_from = start;
                reach = end;
                continue;
            }
            int64_t gap = wrap_sub(start, reach); /* reach: the latest end before this one */
            if (start > reach) { /* a new busy interval */
                outs[0].at[outs[0].n++] = open_from;
                outs[1].at[outs[1].n++] = reach;
                open_from = start;
            }
            if (gap > 0) {
                outs[4].at[outs[4].n++] = gap;
                if (call >= 0) {
                    outs[2].at[outs[2].n++] = call > reach ? call : reach;
                    outs[3].at[outs[3].n++] = start;
                    if (call <= reach) outs[5].at[outs[5].n++] = gap;
                }
            }
            if (end > reach) reach = end;
        }
    }
    if (n && sorted && !bad_row) {
        outs[0].at[outs[0].n++] = open_from;
        outs[1].at[outs[1].n++] = reach;
    }
    Py_END_ALLOW_THREADS
    if (bad_row) {
        PyErr_SetString(PyExc_ValueError, "stream: a row past row_count");
        goto done;
    }
    if (!sorted) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (!(rows_out = PyList_New(0)) || !(latency_out = PyList_New(0))) goto done;
    for (Py_ssize_t r = 0; r < row_count; r++) {
        Row *k = &per[r];
        PyObject *item;
        if (k->count) {
            PyObject *total = sum_long(&k->total);
            item = total ? Py_BuildValue("(nLNLL)", r, (long long)k->count, total,
                                         (long long)k->low, (long long)k->high)
                         : NULL;
            if (!item || PyList_Append(rows_out, item) < 0) {
                Py_XDECREF(item);
                goto done;
            }
            Py_DECREF(item);
        }
        if (k->latency_count) {
            PyObject *total = sum_long(&k->latency_total);
            item = total ? Py_BuildValue("(nLNL)", r, (long long)k->latency_count, total,
                                         (long long)k->latency_high)
                         : NULL;
            if (!item || PyList_Append(latency_out, item) < 0) {
                Py_XDECREF(item);
                goto done;
            }
            Py_DECREF(item);
        }
    }
    for (int o = 0; o < 6; o++)
        if (!out_close(&outs[o])) goto done;
    result = Py_BuildValue("(OOLLLOOOOOO)", rows_out, latency_out, (long long)correlated,
                           (long long)first, (long long)reach, outs[0].bytes, outs[1].bytes,
                           outs[2].bytes, outs[3].bytes, outs[4].bytes, outs[5].bytes);
done:
    Py_XDECREF(rows_out);
    Py_XDECREF(latency_out);
    for (int o = 0; o < 6; o++) Py_XDECREF(outs[o].bytes);
    PyMem_Free(per);
    for (Py_ssize_t h = 0; h < held; h++) PyBuffer_Release(&pv[h]);
    PyMem_Free(pv);
    PyMem_Free(lengths);
    for (int v = 0; v < 3; v++)
        if (views[v].obj) PyBuffer_Release(&views[v]);
    return result;
}

PyDoc_STRVAR(launch_calls_doc,
"launch_calls(ids, offsets, durations, kinds, values, string_ids, call_metas, base_ns, /)\n"
"--\n\n"
"A host line's piece (int64 buffers: metadata ids, offsets and durations in ps; the\n"
"correlation_id column's int8 ``kinds`` and int64 ``values``, ``string_ids`` the ids\n"
"its str_values read as, -1 none) -> (correlation ids, start ns) of its launch calls:\n"
"events whose metadata id is one of the sorted ``call_metas``, of sane times and a\n"
"correlation id >= 0, as int64 array bytes (gpu_kernels._launch_piece_numpy's).");

static PyObject *launch_calls(PyObject *self, PyObject *args) {
    Py_buffer views[7] = {{0}};
    long long base_ns;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*L:launch_calls", &views[0], &views[1],
                          &views[2], &views[3], &views[4], &views[5], &views[6], &base_ns))
        return NULL;
    PyObject *result = NULL;
    Out outs[2] = {{0}};
    Py_ssize_t sizes[7] = {0};
    for (int v = 0; v < 7; v++)
        if (v != 3 && !int64s(&views[v], &sizes[v])) goto done;
    Py_ssize_t n = sizes[0];
    if (sizes[1] != n || sizes[2] != n || views[3].len != n || sizes[4] != n) {
        PyErr_SetString(PyExc_ValueError, "launch_calls: columns of unequal length");
        goto done;
    }
    const int64_t *meta = views[0].buf, *off = views[1].buf, *dur = views[2].buf,
                  *value = views[4].buf, *string_id = views[5].buf, *calls = views[6].buf;
    const int8_t *kind = views[3].buf;
    Py_ssize_t strings = sizes[5], calls_n = sizes[6];
    if (!out_open(&outs[0], n) || !out_open(&outs[1], n)) goto done;
    int bad_string = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (dur[i] < 0 || dur[i] > FAR || off[i] <= -FAR || off[i] >= FAR) continue;
        int64_t corr = -1, v = value[i];
        if (kind[i] == KIND_INT64 || (kind[i] == KIND_UINT64 && v >= 0)) {
            corr = v;
        } else if (kind[i] == KIND_STR) {
            if (v < 0 || v >= strings) {
                bad_string = 1;
                break;
            }
            corr = string_id[v];
        }
        if (corr < 0) continue;
        if (search(calls, calls_n, meta[i]) < 0) continue; /* not a launch call */
        outs[0].at[outs[0].n++] = corr;
        outs[1].at[outs[1].n++] = wrap_add((int64_t)base_ns, floor_ns(off[i]));
    }
    Py_END_ALLOW_THREADS
    if (bad_string) {
        PyErr_SetString(PyExc_ValueError, "launch_calls: a string index past the strings");
        goto done;
    }
    if (out_close(&outs[0]) && out_close(&outs[1]))
        result = Py_BuildValue("(OO)", outs[0].bytes, outs[1].bytes);
done:
    Py_XDECREF(outs[0].bytes);
    Py_XDECREF(outs[1].bytes);
    for (int v = 0; v < 7; v++)
        if (views[v].obj) PyBuffer_Release(&views[v]);
    return result;
}

static PyMethodDef methods[] = {
    {"stream", stream, METH_VARARGS, stream_doc},
    {"launch_calls", launch_calls, METH_VARARGS, launch_calls_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef_Slot slots[] = {
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernel_streams",
    "The per-kernel passes of exporter.analysis.facts.gpu_kernels, compiled.", 0,
    methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernel_streams(void) { return PyModuleDef_Init(&module); }
