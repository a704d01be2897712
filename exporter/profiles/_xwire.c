/* The compiled decode core of XProf captures: XLine wire bytes -> event columns.
 *
 * The per-event work of reading a capture is the floor of every conversion: through
 * protobuf, each event becomes a Python message object whose three fields are then
 * read one by one. Here one pass over a line's wire bytes writes the events' metadata
 * ids, offsets and durations straight into three int64 arrays (returned as bytes for
 * numpy.frombuffer), and the line's header fields are read by skipping over its events.
 *
 * Only the canonical encoding protobuf writers produce is decoded (the field numbers
 * and wire types of exporter/proto/xplane.proto, fields in any order, unknown fields
 * skipped). Anything else -- a known field with another wire type, a group, a varint
 * longer than 10 bytes, a length past the end -- returns None, and the caller reads that
 * line with protobuf instead (exporter/profiles/xspace.py), so both paths give the same
 * columns and protobuf's own error names a corrupt line. No dependency beyond CPython's
 * C API: the package builds with the machine's compiler, and installs without this
 * module where there is none (setuptools' optional extension).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* XLine and XEvent field numbers (exporter/proto/xplane.proto). */
enum { LINE_ID = 1, LINE_NAME = 2, LINE_TIMESTAMP_NS = 3, LINE_EVENTS = 4,
       LINE_DURATION_PS = 9, LINE_DISPLAY_ID = 10, LINE_DISPLAY_NAME = 11 };
enum { EVENT_METADATA_ID = 1, EVENT_OFFSET_PS = 2, EVENT_DURATION_PS = 3,
       EVENT_STATS = 4, EVENT_NUM_OCCURRENCES = 5 };
enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

/* Reads a varint at *p (< end) into *out; 0 when truncated or longer than 10 bytes. */
static inline int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    const uint8_t *q = *p;
    uint64_t value = 0;
    for (int shift = 0; shift < 70 && q < end; shift += 7) {
        uint8_t byte = *q++;
        value |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *out = value;
            *p = q;
            return 1;
        }
    }
    return 0;
}

/* Skips one field's value of an unknown field; 0 when it cannot (groups, truncation). */
static inline int skip_value(const uint8_t **p, const uint8_t *end, unsigned wire) {
    uint64_t n;
    switch (wire) {
    case WIRE_VARINT:
        return read_varint(p, end, &n);
    case WIRE_FIXED64:
        if (end - *p < 8) return 0;
        *p += 8;
        return 1;
    case WIRE_FIXED32:
        if (end - *p < 4) return 0;
        *p += 4;
        return 1;
    case WIRE_LEN:
        if (!read_varint(p, end, &n) || n > (uint64_t)(end - *p)) return 0;
        *p += n;
        return 1;
    default:
        return 0;
    }
}

/* Reads a tag: field number and wire type; 0 on a bad tag. */
static inline int read_tag(const uint8_t **p, const uint8_t *end, uint64_t *number,
                           unsigned *wire) {
    uint64_t tag;
    if (!read_varint(p, end, &tag)) return 0;
    *number = tag >> 3;
    *wire = (unsigned)(tag & 7);
    return *number >= 1 && *number <= 0x1fffffff;
}

/* Reads a length-delimited field's body bounds. */
static inline int read_len(const uint8_t **p, const uint8_t *end, const uint8_t **body,
                           const uint8_t **body_end) {
    uint64_t n;
    if (!read_varint(p, end, &n) || n > (uint64_t)(end - *p)) return 0;
    *body = *p;
    *body_end = *p + n;
    *p += n;
    return 1;
}

/* Decodes one XEvent; protobuf's rules: the last value of a field wins, and the
 * offset_ps / num_occurrences oneof keeps the last member set (the other reads 0). */
static int decode_event(const uint8_t *p, const uint8_t *end, int64_t *meta, int64_t *off,
                        int64_t *dur) {
    int64_t m = 0, o = 0, d = 0;
    while (p < end) {
        uint64_t number, value;
        unsigned wire;
        if (!read_tag(&p, end, &number, &wire)) return 0;
        if (number == EVENT_METADATA_ID || number == EVENT_OFFSET_PS ||
            number == EVENT_DURATION_PS || number == EVENT_NUM_OCCURRENCES) {
            if (wire != WIRE_VARINT || !read_varint(&p, end, &value)) return 0;
            if (number == EVENT_METADATA_ID) m = (int64_t)value;
            else if (number == EVENT_OFFSET_PS) o = (int64_t)value;
            else if (number == EVENT_DURATION_PS) d = (int64_t)value;
            else o = 0;
        } else if (number == EVENT_STATS) {
            if (wire != WIRE_LEN || !skip_value(&p, end, wire)) return 0;
        } else if (!skip_value(&p, end, wire)) {
            return 0;
        }
    }
    *meta = m;
    *off = o;
    *dur = d;
    return 1;
}

/* The line's events as a count, or -1 when the line is not canonical. */
static Py_ssize_t count_events(const uint8_t *p, const uint8_t *end) {
    Py_ssize_t n = 0;
    while (p < end) {
        uint64_t number;
        unsigned wire;
        if (!read_tag(&p, end, &number, &wire)) return -1;
        if (number == LINE_EVENTS) {
            if (wire != WIRE_LEN || !skip_value(&p, end, wire)) return -1;
            n++;
        } else if (!skip_value(&p, end, wire)) {
            return -1;
        }
    }
    return n;
}

PyDoc_STRVAR(line_events_doc,
"line_events(line, /)\n--\n\n"
"(metadata ids, offsets ps, durations ps) of a serialized XLine's events, each the\n"
"bytes of an int64 array in event order; None when the line is not canonical protobuf.");

static PyObject *line_events(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *start = view.buf, *end = start + view.len;
    PyObject *result = NULL, *ids = NULL, *offs = NULL, *durs = NULL;
    Py_ssize_t n;
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    n = count_events(start, end);
    Py_END_ALLOW_THREADS
    if (n < 0) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    ids = PyBytes_FromStringAndSize(NULL, n * 8);
    offs = PyBytes_FromStringAndSize(NULL, n * 8);
    durs = PyBytes_FromStringAndSize(NULL, n * 8);
    if (ids == NULL || offs == NULL || durs == NULL) goto done;
    int64_t *m = (int64_t *)PyBytes_AS_STRING(ids);
    int64_t *o = (int64_t *)PyBytes_AS_STRING(offs);
    int64_t *d = (int64_t *)PyBytes_AS_STRING(durs);
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *p = start;
    Py_ssize_t i = 0;
    while (ok && p < end) {
        uint64_t number;
        unsigned wire;
        read_tag(&p, end, &number, &wire); /* checked by count_events */
        if (number == LINE_EVENTS) {
            const uint8_t *body, *body_end;
            read_len(&p, end, &body, &body_end);
            ok = decode_event(body, body_end, &m[i], &o[i], &d[i]);
            i++;
        } else {
            skip_value(&p, end, wire);
        }
    }
    Py_END_ALLOW_THREADS
    if (!ok) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = PyTuple_Pack(3, ids, offs, durs);
done:
    Py_XDECREF(ids);
    Py_XDECREF(offs);
    Py_XDECREF(durs);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(line_header_doc,
"line_header(line, /)\n--\n\n"
"(id, display_id, name, display_name, timestamp_ns, duration_ps, events) of a\n"
"serialized XLine, names as UTF-8 bytes; None when the line is not canonical protobuf.");

static PyObject *line_header(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = view.buf, *end = p + view.len;
    const uint8_t *name = NULL, *name_end = NULL, *display = NULL, *display_end = NULL;
    int64_t ints[4] = {0, 0, 0, 0}; /* id, display_id, timestamp_ns, duration_ps */
    Py_ssize_t events = 0;
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    while (ok && p < end) {
        uint64_t number, value;
        unsigned wire;
        if (!read_tag(&p, end, &number, &wire)) {
            ok = 0;
            break;
        }
        int slot = number == LINE_ID ? 0 : number == LINE_DISPLAY_ID ? 1
                 : number == LINE_TIMESTAMP_NS ? 2 : number == LINE_DURATION_PS ? 3 : -1;
        if (slot >= 0) {
            ok = wire == WIRE_VARINT && read_varint(&p, end, &value);
            ints[slot] = (int64_t)value;
        } else if (number == LINE_NAME) {
            ok = wire == WIRE_LEN && read_len(&p, end, &name, &name_end);
        } else if (number == LINE_DISPLAY_NAME) {
            ok = wire == WIRE_LEN && read_len(&p, end, &display, &display_end);
        } else if (number == LINE_EVENTS) {
            ok = wire == WIRE_LEN && skip_value(&p, end, wire);
            events++;
        } else {
            ok = skip_value(&p, end, wire);
        }
    }
    Py_END_ALLOW_THREADS
    PyObject *result;
    if (!ok) {
        result = Py_NewRef(Py_None);
    } else {
        result = Py_BuildValue(
            "(LLy#y#LLn)", (long long)ints[0], (long long)ints[1],
            name ? (const char *)name : "", (Py_ssize_t)(name ? name_end - name : 0),
            display ? (const char *)display : "",
            (Py_ssize_t)(display ? display_end - display : 0), (long long)ints[2],
            (long long)ints[3], events);
    }
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"line_events", line_events, METH_O, line_events_doc},
    {"line_header", line_header, METH_O, line_header_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef_Slot slots[] = {
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_xwire",
    "The compiled decode core of XProf captures (see exporter/profiles/xspace.py).", 0,
    methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__xwire(void) { return PyModuleDef_Init(&module); }
