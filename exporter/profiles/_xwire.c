/* The compiled decode core of XProf captures: XLine wire bytes -> event columns.
 *
 * The per-event work of reading a capture is the floor of every conversion: through
 * protobuf, each event becomes a Python message object whose three fields are then
 * read one by one. Here one pass over a line's wire bytes writes the events' metadata
 * ids, offsets and durations straight into three int64 arrays (returned as bytes for
 * numpy.frombuffer), and the line's header fields are read by skipping over its events.
 *
 * A line need not be in memory whole: scan_line reads the whole fields at the start of
 * a window of its bytes and says how far it got, so the caller (xspace.py) walks a line
 * of any size through windows of bounded size. Protobuf writes a line's header fields
 * around its events (duration_ps and display_name after them), so headers are also
 * gathered across windows.
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

/* One top-level field of a line at *p: its number and wire type, a varint's value or a
 * length-delimited body's bounds. 1: a whole field, *p moved past it; 0: the field runs
 * past end and more bytes may follow (only when !final); -1: not canonical protobuf. A
 * varint cut by end is "more bytes" only while fewer than 10 bytes remain. */
static int next_field(const uint8_t **p, const uint8_t *end, int final, uint64_t *number,
                      unsigned *wire, uint64_t *value, const uint8_t **body) {
    const uint8_t *q = *p;
    uint64_t tag;
    if (!read_varint(&q, end, &tag)) return !final && end - q < 10 ? 0 : -1;
    *number = tag >> 3;
    *wire = (unsigned)(tag & 7);
    if (*number < 1 || *number > 0x1fffffff) return -1;
    switch (*wire) {
    case WIRE_VARINT:
        if (!read_varint(&q, end, value)) return !final && end - q < 10 ? 0 : -1;
        break;
    case WIRE_FIXED64:
    case WIRE_FIXED32: {
        Py_ssize_t size = *wire == WIRE_FIXED64 ? 8 : 4;
        if (end - q < size) return final ? -1 : 0;
        q += size;
        break;
    }
    case WIRE_LEN:
        if (!read_varint(&q, end, value)) return !final && end - q < 10 ? 0 : -1;
        if (*value > (uint64_t)(end - q)) return final ? -1 : 0;
        *body = q;
        q += *value;
        break;
    default:
        return -1;
    }
    *p = q;
    return 1;
}

/* What a scan of a line's bytes found: header fields (the last value of each wins, as
 * in protobuf), the events' count, and where the whole fields end. */
typedef struct {
    int64_t ints[4]; /* id, display_id, timestamp_ns, duration_ps */
    int seen;        /* bit i: ints[i] was set; bit 4: name; bit 5: display_name */
    const uint8_t *name, *name_end, *display, *display_end;
    Py_ssize_t events;
    const uint8_t *stop; /* past the last whole field */
} Scan;

/* Frames the whole fields of [p, end): 0, or -1 when they are not canonical. With
 * columns (sized for scan->events of an earlier pass), decodes each event into them. */
static int scan(const uint8_t *p, const uint8_t *end, int final, Scan *out, int64_t *m,
                int64_t *o, int64_t *d) {
    memset(out, 0, sizeof *out);
    out->stop = p;
    for (;;) {
        uint64_t number, value = 0;
        unsigned wire;
        const uint8_t *body = NULL;
        int found = p < end ? next_field(&p, end, final, &number, &wire, &value, &body) : 0;
        if (found < 0) return -1;
        if (found == 0) return 0;
        out->stop = p;
        int slot = number == LINE_ID ? 0 : number == LINE_DISPLAY_ID ? 1
                 : number == LINE_TIMESTAMP_NS ? 2 : number == LINE_DURATION_PS ? 3 : -1;
        if (slot >= 0) {
            if (wire != WIRE_VARINT) return -1;
            out->ints[slot] = (int64_t)value;
            out->seen |= 1 << slot;
        } else if (number == LINE_NAME || number == LINE_DISPLAY_NAME) {
            if (wire != WIRE_LEN) return -1;
            if (number == LINE_NAME) {
                out->name = body, out->name_end = body + value, out->seen |= 1 << 4;
            } else {
                out->display = body, out->display_end = body + value, out->seen |= 1 << 5;
            }
        } else if (number == LINE_EVENTS) {
            if (wire != WIRE_LEN) return -1;
            if (m != NULL) {
                Py_ssize_t i = out->events;
                if (!decode_event(body, body + value, &m[i], &o[i], &d[i])) return -1;
            }
            out->events++;
        }
    }
}

PyDoc_STRVAR(scan_line_doc,
"scan_line(data, final, events, /)\n--\n\n"
"Reads the whole fields at the start of a serialized XLine's bytes ``data`` (all of\n"
"the line when ``final``; else a window of it, whose last field may be cut). Returns\n"
"None when they are not canonical protobuf, else (consumed, (id, display_id,\n"
"timestamp_ns, duration_ps), seen, name, display_name, event count, columns):\n"
"``consumed`` the bytes of the whole fields read, ``seen`` a bitmask of the header\n"
"fields present (bits 0-3 the ints, 4 name, 5 display_name; the last value wins),\n"
"names as bytes, and with ``events`` the columns (metadata ids, offsets ps,\n"
"durations ps) as the bytes of three int64 arrays in event order, else None.");

static PyObject *scan_line(PyObject *self, PyObject *args) {
    Py_buffer view;
    int final, events;
    if (!PyArg_ParseTuple(args, "y*pp:scan_line", &view, &final, &events)) return NULL;
    const uint8_t *start = view.buf, *end = start + view.len;
    PyObject *result = NULL, *ids = NULL, *offs = NULL, *durs = NULL, *columns = NULL;
    Scan found;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = scan(start, end, final, &found, NULL, NULL, NULL);
    Py_END_ALLOW_THREADS
    if (status < 0) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    if (events) {
        Py_ssize_t n = found.events;
        ids = PyBytes_FromStringAndSize(NULL, n * 8);
        offs = PyBytes_FromStringAndSize(NULL, n * 8);
        durs = PyBytes_FromStringAndSize(NULL, n * 8);
        if (ids == NULL || offs == NULL || durs == NULL) goto done;
        int64_t *m = (int64_t *)PyBytes_AS_STRING(ids);
        int64_t *o = (int64_t *)PyBytes_AS_STRING(offs);
        int64_t *d = (int64_t *)PyBytes_AS_STRING(durs);
        Py_BEGIN_ALLOW_THREADS
        status = scan(start, found.stop, 1, &found, m, o, d);
        Py_END_ALLOW_THREADS
        if (status < 0) {  /* an event that is not canonical */
            result = Py_NewRef(Py_None);
            goto done;
        }
        columns = PyTuple_Pack(3, ids, offs, durs);
        if (columns == NULL) goto done;
    } else {
        columns = Py_NewRef(Py_None);
    }
    PyObject *name = found.name
        ? PyBytes_FromStringAndSize((const char *)found.name, found.name_end - found.name)
        : Py_NewRef(Py_None);
    PyObject *display = found.display
        ? PyBytes_FromStringAndSize((const char *)found.display,
                                    found.display_end - found.display)
        : Py_NewRef(Py_None);
    if (name != NULL && display != NULL) {
        result = Py_BuildValue(
            "(n(LLLL)iOOnO)", (Py_ssize_t)(found.stop - start), (long long)found.ints[0],
            (long long)found.ints[1], (long long)found.ints[2], (long long)found.ints[3],
            found.seen, name, display, found.events, columns);
    }
    Py_XDECREF(name);
    Py_XDECREF(display);
done:
    Py_XDECREF(columns);
    Py_XDECREF(ids);
    Py_XDECREF(offs);
    Py_XDECREF(durs);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_line", scan_line, METH_VARARGS, scan_line_doc},
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
