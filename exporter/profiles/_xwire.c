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
 * longer than 10 bytes, a tag longer than 5, a length past the end, a string field
 * (line names, a stat's str_value) that is not UTF-8, an event's stat that does not
 * frame -- returns None, and the caller reads that line with protobuf instead
 * (exporter/profiles/xspace.py), so both paths give the same columns and protobuf's own
 * error names a corrupt line. The rule is one-sided: this core may hand protobuf a line
 * protobuf accepts, never accept one protobuf refuses (the differential fuzz in
 * tests/unit/test_decoder.py holds it to that). No dependency beyond CPython's
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
enum { STAT_METADATA_ID = 1, STAT_DOUBLE_VALUE = 2, STAT_UINT64_VALUE = 3,
       STAT_INT64_VALUE = 4, STAT_STR_VALUE = 5, STAT_BYTES_VALUE = 6, STAT_REF_VALUE = 7 };
enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };
/* protobuf reads a tag as a 32-bit varint: at most 5 bytes (upb refuses a longer one). */
enum { MAX_TAG_BYTES = 5 };

/* Reads a varint at *p (< end) into *out; 0 when truncated or longer than 10 bytes. */
static inline int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    const uint8_t *q = *p;
    if (q < end && !(*q & 0x80)) { /* one byte: tags, ids and lengths, mostly */
        *out = *q;
        *p = q + 1;
        return 1;
    }
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

/* Reads a tag: field number and wire type; 0 on a bad tag (longer than protobuf's). */
static inline int read_tag(const uint8_t **p, const uint8_t *end, uint64_t *number,
                           unsigned *wire) {
    const uint8_t *start = *p;
    uint64_t tag;
    if (!read_varint(p, end, &tag) || *p - start > MAX_TAG_BYTES) return 0;
    *number = tag >> 3;
    *wire = (unsigned)(tag & 7);
    return *number >= 1 && *number <= 0x1fffffff;
}

/* Whether [p, end) is UTF-8 as protobuf (utf8_range) and Python's codec check it for a
 * proto3 string: no overlong forms, no surrogates, nothing past U+10FFFF. */
static int valid_utf8(const uint8_t *p, const uint8_t *end) {
    while (p < end) {
        uint8_t c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        int more;
        uint8_t lo = 0x80, hi = 0xbf; /* the range of the second byte */
        if (c >= 0xc2 && c <= 0xdf) more = 1;
        else if (c == 0xe0) more = 2, lo = 0xa0;
        else if (c == 0xed) more = 2, hi = 0x9f;
        else if (c >= 0xe1 && c <= 0xef) more = 2;
        else if (c == 0xf0) more = 3, lo = 0x90;
        else if (c == 0xf4) more = 3, hi = 0x8f;
        else if (c >= 0xf1 && c <= 0xf3) more = 3;
        else return 0;
        if (end - p <= more || p[1] < lo || p[1] > hi) return 0;
        for (int i = 2; i <= more; i++)
            if ((p[i] & 0xc0) != 0x80) return 0;
        p += more + 1;
    }
    return 1;
}

/* Whether an XStat's bytes parse in protobuf, judged no more leniently: every field
 * frames (tags, lengths, no groups) and a str_value is UTF-8. Its values are not read:
 * no conversion through this core uses them, but protobuf refuses the line without them. */
static inline int valid_stat(const uint8_t *p, const uint8_t *end) {
    while (p < end) {
        uint64_t number, n;
        unsigned wire;
        if (!read_tag(&p, end, &number, &wire)) return 0;
        if (number == STAT_STR_VALUE && wire == WIRE_LEN) {
            if (!read_varint(&p, end, &n) || n > (uint64_t)(end - p)) return 0;
            if (!valid_utf8(p, p + n)) return 0;
            p += n;
        } else if (!skip_value(&p, end, wire)) {
            return 0;
        }
    }
    return 1;
}

/* -- selected stats of each event as columns (scan_line's ``stats``) ------------------ */

/* The distinct str_value strings met, as spans of the line's bytes: (index + 1) in an
 * open-addressing map on their hash; 0 marks an empty slot. Made without the GIL. */
typedef struct {
    const uint8_t **text;
    Py_ssize_t *length;
    Py_ssize_t count, capacity;
    Py_ssize_t *slots;
    size_t mask;
} Strings;

/* What the caller wants of the stats: sorted stat metadata ids, each with the slot
 * (column) its value goes to, and per event and slot a kind and a value. */
typedef struct {
    const int64_t *ids, *slots;
    Py_ssize_t n_ids, width, events; /* events: a column's length (columns follow each
                                       * other, so numpy reads one contiguously) */
    int8_t *kind;   /* per slot and event: 0 none; 1 the stat without a value; else the
                     * number of its value's field (2 double ... 7 ref_value) */
    int64_t *value; /* the value's bits; for a str_value its index in strings */
    Strings strings;
} StatColumns;

static inline uint64_t hash_bytes(const uint8_t *p, Py_ssize_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;  /* FNV-1a, its high bits folded into the low */
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h ^ (h >> 29) ^ (h >> 47);
}

static void strings_free(Strings *s) {
    PyMem_RawFree(s->text);
    PyMem_RawFree(s->length);
    PyMem_RawFree(s->slots);
    memset(s, 0, sizeof *s);
}

/* The index of [p, p + n) among the strings, added when new; -1 when out of memory. */
static Py_ssize_t intern_string(Strings *s, const uint8_t *p, Py_ssize_t n) {
    if (s->count == s->capacity) {  /* keeps the map at most half full */
        Py_ssize_t capacity = s->capacity ? s->capacity * 2 : 64;
        const uint8_t **text = PyMem_RawRealloc(s->text, capacity * sizeof *text);
        if (text == NULL) return -1;
        s->text = text;
        Py_ssize_t *length = PyMem_RawRealloc(s->length, capacity * sizeof *length);
        if (length == NULL) return -1;
        s->length = length;
        Py_ssize_t *slots = PyMem_RawCalloc((size_t)capacity * 2, sizeof *slots);
        if (slots == NULL) return -1;
        PyMem_RawFree(s->slots);
        s->slots = slots, s->mask = (size_t)capacity * 2 - 1, s->capacity = capacity;
        for (Py_ssize_t i = 0; i < s->count; i++) {
            size_t at = hash_bytes(s->text[i], s->length[i]) & s->mask;
            while (s->slots[at]) at = (at + 1) & s->mask;
            s->slots[at] = i + 1;
        }
    }
    size_t at = hash_bytes(p, n) & s->mask;
    while (s->slots[at]) {
        Py_ssize_t i = s->slots[at] - 1;
        if (s->length[i] == n && memcmp(s->text[i], p, (size_t)n) == 0) return i;
        at = (at + 1) & s->mask;
    }
    s->text[s->count] = p, s->length[s->count] = n;
    s->slots[at] = s->count + 1;
    return s->count++;
}

/* The slot of stat metadata id ``id``, or -1 when it is not wanted. */
static inline Py_ssize_t slot_of_stat(const StatColumns *st, int64_t id) {
    Py_ssize_t lo = 0, hi = st->n_ids;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (st->ids[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < st->n_ids && st->ids[lo] == id ? (Py_ssize_t)st->slots[lo] : -1;
}

/* Reads one XStat as protobuf would: the last metadata_id wins, and of the value oneof
 * the last member set. A known field of another wire type is refused (0): protobuf
 * then reads the line. Its value goes to event ``row``'s column of its id's slot, if
 * wanted (a later stat of the same slot wins). 1: read; 0: not canonical; -1: no memory. */
static int read_stat(const uint8_t *p, const uint8_t *end, StatColumns *st, Py_ssize_t row) {
    int64_t id = 0;
    uint64_t value = 0;
    int kind = 1;
    const uint8_t *text = NULL;
    Py_ssize_t text_length = 0;
    while (p < end) {
        uint64_t number, n;
        unsigned wire;
        if (!read_tag(&p, end, &number, &wire)) return 0;
        switch (number) {
        case STAT_METADATA_ID:
        case STAT_UINT64_VALUE:
        case STAT_INT64_VALUE:
        case STAT_REF_VALUE:
            if (wire != WIRE_VARINT || !read_varint(&p, end, &n)) return 0;
            if (number == STAT_METADATA_ID) id = (int64_t)n;
            else kind = (int)number, value = n;
            break;
        case STAT_DOUBLE_VALUE:
            if (wire != WIRE_FIXED64 || end - p < 8) return 0;
            value = 0;
            for (int i = 7; i >= 0; i--) value = value << 8 | p[i];  /* little-endian */
            p += 8;
            kind = STAT_DOUBLE_VALUE;
            break;
        case STAT_STR_VALUE:
        case STAT_BYTES_VALUE:
            if (wire != WIRE_LEN || !read_varint(&p, end, &n) || n > (uint64_t)(end - p))
                return 0;
            if (number == STAT_STR_VALUE && !valid_utf8(p, p + n)) return 0;
            kind = (int)number, text = p, text_length = (Py_ssize_t)n;
            p += n;
            break;
        default:
            if (!skip_value(&p, end, wire)) return 0;
        }
    }
    Py_ssize_t slot = slot_of_stat(st, id);
    if (slot < 0) return 1;
    if (kind == STAT_STR_VALUE) {
        Py_ssize_t index = intern_string(&st->strings, text, text_length);
        if (index < 0) return -1;
        value = (uint64_t)index;
    } else if (kind == STAT_BYTES_VALUE) {
        value = 0;  /* not read: no conversion uses a stat's bytes */
    }
    st->kind[slot * st->events + row] = (int8_t)kind;
    st->value[slot * st->events + row] = (int64_t)value;
    return 1;
}

/* Decodes one XEvent; protobuf's rules: the last value of a field wins, and the
 * offset_ps / num_occurrences oneof keeps the last member set (the other reads 0). With
 * ``st``, its wanted stats go to row ``row`` of their columns. 1: decoded; 0: not
 * canonical; -1: out of memory. */
static int decode_event(const uint8_t *p, const uint8_t *end, int64_t *meta, int64_t *off,
                        int64_t *dur, StatColumns *st, Py_ssize_t row) {
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
            if (wire != WIRE_LEN || !read_varint(&p, end, &value) ||
                value > (uint64_t)(end - p))
                return 0;
            int read = st != NULL ? read_stat(p, p + value, st, row) : valid_stat(p, p + value);
            if (read <= 0) return read;
            p += value;
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
    if (q - *p > MAX_TAG_BYTES) return -1;
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

/* Frames the whole fields of [p, end): 0, -1 when they are not canonical, -2 when out of
 * memory. With columns (sized for scan->events of an earlier pass), decodes each event
 * into them, and with ``st`` its wanted stats. */
static int scan(const uint8_t *p, const uint8_t *end, int final, Scan *out, int64_t *m,
                int64_t *o, int64_t *d, StatColumns *st) {
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
            if (wire != WIRE_LEN || !valid_utf8(body, body + value)) return -1;
            if (number == LINE_NAME) {
                out->name = body, out->name_end = body + value, out->seen |= 1 << 4;
            } else {
                out->display = body, out->display_end = body + value, out->seen |= 1 << 5;
            }
        } else if (number == LINE_EVENTS) {
            if (wire != WIRE_LEN) return -1;
            if (m != NULL) {
                Py_ssize_t i = out->events;
                int decoded = decode_event(body, body + value, &m[i], &o[i], &d[i], st, i);
                if (decoded <= 0) return decoded < 0 ? -2 : -1;
            }
            out->events++;
        }
    }
}

PyDoc_STRVAR(scan_line_doc,
"scan_line(data, final, events, stat_ids=None, stat_slots=None, width=0, /)\n--\n\n"
"Reads the whole fields at the start of a serialized XLine's bytes ``data`` (all of\n"
"the line when ``final``; else a window of it, whose last field may be cut). Returns\n"
"None when they are not canonical protobuf, else (consumed, (id, display_id,\n"
"timestamp_ns, duration_ps), seen, name, display_name, event count, columns):\n"
"``consumed`` the bytes of the whole fields read, ``seen`` a bitmask of the header\n"
"fields present (bits 0-3 the ints, 4 name, 5 display_name; the last value wins),\n"
"names as bytes, and with ``events`` the columns (metadata ids, offsets ps,\n"
"durations ps) as the bytes of three int64 arrays in event order, else None.\n\n"
"With ``stat_ids`` (the bytes of an int64 array of stat metadata ids, ascending) and\n"
"``stat_slots`` (each id's column, below ``width``), the columns also hold each event's\n"
"wanted stats, column after column (``width`` columns of the event count each): kinds\n"
"(int8: 0 no such stat, 1 the stat without a value, else the field number of its value,\n"
"2 double ... 7 ref_value), values (int64: the value's bits; a str_value's index in the\n"
"strings; 0 for bytes) and the\n"
"distinct str_values (a list of str). Of an event's stats of one column the last wins;\n"
"a stat's known field of another wire type is not canonical (None).");

static int int64_array(Py_buffer *view, Py_ssize_t *n);

/* The wanted stats of scan_line: 1 with none (st->width 0), 0 with ValueError. */
static int stat_request(Py_buffer *ids, Py_buffer *slots, Py_ssize_t width, StatColumns *st) {
    memset(st, 0, sizeof *st);
    if (ids->buf == NULL && slots->buf == NULL) return 1;
    Py_ssize_t n, n_slots;
    if (!int64_array(ids, &n) || !int64_array(slots, &n_slots)) return 0;
    if (n != n_slots || width < 1 || width > 64) {
        PyErr_SetString(PyExc_ValueError,
                        "stat_ids and stat_slots differ in length, or width is not 1..64");
        return 0;
    }
    const int64_t *id = ids->buf, *slot = slots->buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((i && id[i] <= id[i - 1]) || slot[i] < 0 || slot[i] >= width) {
            PyErr_SetString(PyExc_ValueError,
                            "stat_ids must ascend and each slot be below width");
            return 0;
        }
    }
    st->ids = id, st->slots = slot, st->n_ids = n, st->width = width;
    return 1;
}

static PyObject *scan_line(PyObject *self, PyObject *args) {
    Py_buffer view, stat_ids = {0}, stat_slots = {0};
    int final, events;
    Py_ssize_t width = 0;
    if (!PyArg_ParseTuple(args, "y*pp|z*z*n:scan_line", &view, &final, &events, &stat_ids,
                          &stat_slots, &width))
        return NULL;
    const uint8_t *start = view.buf, *end = start + view.len;
    PyObject *result = NULL, *ids = NULL, *offs = NULL, *durs = NULL, *columns = NULL;
    PyObject *kinds = NULL, *values = NULL, *strings = NULL;
    StatColumns st;
    Scan found;
    int status;
    if (!stat_request(&stat_ids, &stat_slots, width, &st)) {
        PyBuffer_Release(&view);
        PyBuffer_Release(&stat_ids);
        PyBuffer_Release(&stat_slots);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = scan(start, end, final, &found, NULL, NULL, NULL, NULL);
    Py_END_ALLOW_THREADS
    if (status < 0) {
        result = Py_NewRef(Py_None);
        goto done;
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
        if (st.width) {
            kinds = PyBytes_FromStringAndSize(NULL, n * st.width);
            values = PyBytes_FromStringAndSize(NULL, n * st.width * 8);
            if (kinds == NULL || values == NULL) goto done;
            st.kind = (int8_t *)PyBytes_AS_STRING(kinds);
            st.events = n;
            st.value = (int64_t *)PyBytes_AS_STRING(values);
            memset(st.kind, 0, (size_t)(n * st.width));
            memset(st.value, 0, (size_t)(n * st.width) * 8);
        }
        Py_BEGIN_ALLOW_THREADS
        status = scan(start, found.stop, 1, &found, m, o, d, st.width ? &st : NULL);
        Py_END_ALLOW_THREADS
        if (status == -2) {
            PyErr_NoMemory();
            goto done;
        }
        if (status < 0) {  /* an event that is not canonical */
            result = Py_NewRef(Py_None);
            goto done;
        }
        if (st.width) {
            strings = PyList_New(st.strings.count);
            if (strings == NULL) goto done;
            for (Py_ssize_t i = 0; i < st.strings.count; i++) {
                PyObject *text = PyUnicode_DecodeUTF8((const char *)st.strings.text[i],
                                                      st.strings.length[i], NULL);
                if (text == NULL) goto done;
                PyList_SET_ITEM(strings, i, text);
            }
            columns = PyTuple_Pack(6, ids, offs, durs, kinds, values, strings);
        } else {
            columns = PyTuple_Pack(3, ids, offs, durs);
        }
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
    Py_XDECREF(kinds);
    Py_XDECREF(values);
    Py_XDECREF(strings);
    strings_free(&st.strings);
    PyBuffer_Release(&view);
    PyBuffer_Release(&stat_ids);
    PyBuffer_Release(&stat_slots);
    return result;
}

/* -- nesting and self time (exporter/profiles/nesting.py's numpy twins) --------------- */

/* The int64 array in a buffer of n * 8 bytes; n in *n. 0 (with ValueError) otherwise. */
static int int64_array(Py_buffer *view, Py_ssize_t *n) {
    if (view->len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "an int64 array's bytes are a multiple of 8");
        return 0;
    }
    *n = view->len / 8;
    return 1;
}

PyDoc_STRVAR(contain_doc,
"contain(start, end, /)\n--\n\n"
"Nests one line's events by the ``contain`` rule: ``start`` and ``end`` are the bytes\n"
"of int64 arrays sorted by start (longer first on ties). Each event's parent is the\n"
"innermost open event that contains it; an open event that ends before it does not\n"
"contain it and is closed. Returns (parent, depth, laminar): parent (-1 at the top) and\n"
"depth as int64 array bytes, and whether the events nest properly (no event ends\n"
"inside another that it overlaps), when the ``split`` rule gives the same nesting.");

static PyObject *contain(PyObject *self, PyObject *args) {
    Py_buffer sv, ev;
    if (!PyArg_ParseTuple(args, "y*y*:contain", &sv, &ev)) return NULL;
    PyObject *parent = NULL, *depth = NULL, *result = NULL;
    int64_t *stack = NULL;
    Py_ssize_t n, n_end;
    if (!int64_array(&sv, &n) || !int64_array(&ev, &n_end)) goto done;
    if (n != n_end) {
        PyErr_SetString(PyExc_ValueError, "start and end differ in length");
        goto done;
    }
    parent = PyBytes_FromStringAndSize(NULL, n * 8);
    depth = PyBytes_FromStringAndSize(NULL, n * 8);
    stack = PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (parent == NULL || depth == NULL || stack == NULL) {
        if (stack == NULL) PyErr_NoMemory();
        goto done;
    }
    const int64_t *start = sv.buf, *end = ev.buf;
    int64_t *p = (int64_t *)PyBytes_AS_STRING(parent), *d = (int64_t *)PyBytes_AS_STRING(depth);
    int laminar = 1;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t top = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        while (top > 0 && end[stack[top - 1]] < end[i]) {
            if (end[stack[top - 1]] > start[i]) laminar = 0;  /* overlaps, not contained */
            top--;
        }
        p[i] = top ? stack[top - 1] : -1;
        d[i] = top;
        stack[top++] = i;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(OOO)", parent, depth, laminar ? Py_True : Py_False);
done:
    PyMem_RawFree(stack);
    Py_XDECREF(parent);
    Py_XDECREF(depth);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&ev);
    return result;
}

/* The nodes a line's segments reach, made in order; node 0 is the line's root. */
typedef struct {
    int64_t *parent, *tuple, *level;
    uint64_t *self;  /* unsigned: sums wrap as numpy's int64 does, never undefined */
    Py_ssize_t count, capacity;
    /* Open addressing, (parent node, tuple) + 1 -> node; 0 marks an empty slot. Lines
     * reach few distinct nodes (thousands for millions of segments), so both the map and
     * the arrays start small and double. */
    uint64_t *keys;
    int64_t *values;
    size_t mask;
} Nodes;

static inline uint64_t mix(uint64_t x) {  /* splitmix64's finaliser */
    x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27, x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static inline size_t slot_of(const Nodes *nodes, uint64_t key) {
    size_t at = mix(key) & nodes->mask;
    while (nodes->keys[at] && nodes->keys[at] != key) at = (at + 1) & nodes->mask;
    return at;
}

static int nodes_init(Nodes *nodes) {
    nodes->capacity = 1024;
    nodes->mask = 2048 - 1;
    nodes->parent = PyMem_RawMalloc(1024 * sizeof(int64_t));
    nodes->tuple = PyMem_RawMalloc(1024 * sizeof(int64_t));
    nodes->level = PyMem_RawMalloc(1024 * sizeof(int64_t));
    nodes->self = PyMem_RawMalloc(1024 * sizeof(uint64_t));
    nodes->keys = PyMem_RawCalloc(2048, sizeof(uint64_t));
    nodes->values = PyMem_RawMalloc(2048 * sizeof(int64_t));
    return nodes->parent && nodes->tuple && nodes->level && nodes->self && nodes->keys &&
           nodes->values;
}

static void nodes_free(Nodes *nodes) {
    PyMem_RawFree(nodes->parent);
    PyMem_RawFree(nodes->tuple);
    PyMem_RawFree(nodes->level);
    PyMem_RawFree(nodes->self);
    PyMem_RawFree(nodes->keys);
    PyMem_RawFree(nodes->values);
}

/* Doubles the arrays and the map; 0 when out of memory (nothing lost: the old ones stay). */
static int nodes_grow(Nodes *nodes) {
    size_t capacity = (size_t)nodes->capacity * 2, slots = (nodes->mask + 1) * 2;
    /* Each array by its own type: a write through a pointer of another type (uint64_t*
     * as int64_t*) is one the optimiser may assume changes nothing. */
    int64_t *parent = PyMem_RawRealloc(nodes->parent, capacity * sizeof(int64_t));
    if (parent == NULL) return 0;
    nodes->parent = parent;
    int64_t *tuple = PyMem_RawRealloc(nodes->tuple, capacity * sizeof(int64_t));
    if (tuple == NULL) return 0;
    nodes->tuple = tuple;
    int64_t *level = PyMem_RawRealloc(nodes->level, capacity * sizeof(int64_t));
    if (level == NULL) return 0;
    nodes->level = level;
    uint64_t *self = PyMem_RawRealloc(nodes->self, capacity * sizeof(uint64_t));
    if (self == NULL) return 0;
    nodes->self = self;
    nodes->capacity = (Py_ssize_t)capacity;
    uint64_t *keys = PyMem_RawCalloc(slots, sizeof(uint64_t));
    int64_t *values = PyMem_RawMalloc(slots * sizeof(int64_t));
    if (keys == NULL || values == NULL) {
        PyMem_RawFree(keys);
        PyMem_RawFree(values);
        return 0;
    }
    uint64_t *old_keys = nodes->keys;
    int64_t *old_values = nodes->values;
    size_t old_slots = nodes->mask + 1;
    nodes->keys = keys, nodes->values = values, nodes->mask = slots - 1;
    for (size_t i = 0; i < old_slots; i++) {
        if (old_keys[i]) {
            size_t at = slot_of(nodes, old_keys[i]);
            keys[at] = old_keys[i], values[at] = old_values[i];
        }
    }
    PyMem_RawFree(old_keys);
    PyMem_RawFree(old_values);
    return 1;
}

/* The node of (parent node, tuple), found or made; -1 when out of memory. Its level is
 * the least depth of the segments that reach it: the level at which the numpy twin,
 * which interns level by level, makes it. */
static int64_t node_of(Nodes *nodes, int64_t parent, int64_t tuple, int64_t level) {
    uint64_t key = ((uint64_t)parent << 32 | (uint64_t)tuple) + 1;
    size_t at = slot_of(nodes, key);
    if (nodes->keys[at]) {
        int64_t found = nodes->values[at];
        if (level < nodes->level[found]) nodes->level[found] = level;
        return found;
    }
    if (nodes->count == nodes->capacity) {  /* keeps the map at most half full */
        if (!nodes_grow(nodes)) return -1;
        at = slot_of(nodes, key);
    }
    int64_t made = nodes->count++;
    nodes->keys[at] = key, nodes->values[at] = made;
    nodes->parent[made] = parent, nodes->tuple[made] = tuple, nodes->level[made] = level;
    nodes->self[made] = 0;
    return made;
}

PyDoc_STRVAR(self_tree_doc,
"self_tree(parent, depth, tuples, durations, max_depth, cut, /)\n--\n\n"
"Self time per frame-tree node of one line's nested segments (int64 array bytes, in\n"
"start order, parents before children), as _Frames.assign and window_self compute it\n"
"for one unbounded window. Node 0 is the line's root; a segment's node is (its parent's\n"
"node, its tuple): ``cut`` at depth ``max_depth``, its parent's node deeper, and its\n"
"parent's node (the root at the top) where its tuple is -1 (folded). Each segment adds\n"
"its duration to its node and takes it from its parent's. Returns None when a tuple or\n"
"the segment count exceeds 2**31 (the caller uses numpy), else (parent, tuple, level,\n"
"self) of nodes 1.. as int64 array bytes (parent a node index, level the depth of the\n"
"segments that made it) and the root's self time, or None if no segment touched it.");

static PyObject *self_tree(PyObject *self, PyObject *args) {
    Py_buffer pv, dv, tv, uv;
    long long max_depth, cut;
    if (!PyArg_ParseTuple(args, "y*y*y*y*LL:self_tree", &pv, &dv, &tv, &uv, &max_depth, &cut))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = 0, n1, n2, n3;
    Nodes nodes = {0};
    int64_t *local = NULL;
    if (!int64_array(&pv, &n) || !int64_array(&dv, &n1) || !int64_array(&tv, &n2) ||
        !int64_array(&uv, &n3))
        goto done;
    if (n != n1 || n != n2 || n != n3) {
        PyErr_SetString(PyExc_ValueError, "self_tree's arrays differ in length");
        goto done;
    }
    if (n >= ((Py_ssize_t)1 << 31) || cut < 0 || cut >= ((long long)1 << 31)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    local = PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (!nodes_init(&nodes) || local == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *parent = pv.buf, *depth = dv.buf, *tuple = tv.buf, *duration = uv.buf;
    nodes.count = 1;  /* the root */
    nodes.parent[0] = -1, nodes.tuple[0] = -1, nodes.level[0] = -1, nodes.self[0] = 0;
    /* status 1: a tuple out of range (numpy does it), 2: a parent not before its child,
     * 3: out of memory */
    int touched = 0, status = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t up = parent[i];
        if (up >= i || up < -1) { status = 2; break; }
        int64_t above = up >= 0 ? local[up] : 0;
        int64_t t = depth[i] == max_depth ? cut : tuple[i];
        int64_t node;
        if (depth[i] > max_depth || (t == -1 && depth[i] < max_depth)) {
            node = above;  /* deeper than the cap: the cap's node; folded: the parent's */
        } else if (t < 0 || t >= ((int64_t)1 << 31)) {
            status = 1;
            break;
        } else if ((node = node_of(&nodes, above, t, depth[i])) < 0) {
            status = 3;
            break;
        }
        local[i] = node;
        nodes.self[node] += (uint64_t)duration[i];
        touched |= node == 0;
        if (up >= 0) {
            nodes.self[above] -= (uint64_t)duration[i];
            touched |= above == 0;
        }
    }
    Py_END_ALLOW_THREADS
    if (status == 1) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (status == 2) {
        PyErr_SetString(PyExc_ValueError, "self_tree: a segment's parent is not before it");
        goto done;
    }
    if (status == 3) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t made = nodes.count - 1;
    PyObject *cols[4];
    const void *sources[4] = {nodes.parent + 1, nodes.tuple + 1, nodes.level + 1,
                              nodes.self + 1};
    for (int c = 0; c < 4; c++) {
        cols[c] = PyBytes_FromStringAndSize((const char *)sources[c], made * 8);
    }
    if (cols[0] && cols[1] && cols[2] && cols[3]) {
        PyObject *root = touched ? PyLong_FromLongLong((long long)(int64_t)nodes.self[0])
                                 : Py_NewRef(Py_None);
        if (root != NULL) {
            result = Py_BuildValue("(OOOON)", cols[0], cols[1], cols[2], cols[3], root);
        }
    }
    for (int c = 0; c < 4; c++) Py_XDECREF(cols[c]);
done:
    nodes_free(&nodes);
    PyMem_RawFree(local);
    PyBuffer_Release(&pv);
    PyBuffer_Release(&dv);
    PyBuffer_Release(&tv);
    PyBuffer_Release(&uv);
    return result;
}

PyDoc_STRVAR(first_seen_doc,
"first_seen(columns, /)\n--\n\n"
"Distinct rows of equal-length int64 code columns: ``columns`` is a tuple of 1..64\n"
"objects with the buffer of an int64 array each (row i is their i-th values). Returns\n"
"(key, first): each row's key, numbered in the order the distinct rows first occur,\n"
"and the index of each key's first row, as int64 array bytes. What\n"
"exporter/profiles/event_stats.first_seen_numpy does with dense indexes and sorts, in\n"
"one pass through a hash table of the distinct rows (tests/unit/\n"
"test_gpu_kernel_reductions.py holds the two alike).");

enum { MAX_KEY_COLUMNS = 64 };

/* Row i's hash: a multiply per value, then splitmix64's finaliser mixes the high bits
 * into the low ones the table's mask keeps. */
static inline uint64_t row_hash(const int64_t *const *cols, Py_ssize_t width, Py_ssize_t i) {
    uint64_t h = 0;
    for (Py_ssize_t c = 0; c < width; c++) h = (h ^ (uint64_t)cols[c][i]) * 0x9E3779B97F4A7C15ULL;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 29;
    return h;
}

static inline int same_row(const int64_t *const *cols, Py_ssize_t width, Py_ssize_t a,
                           Py_ssize_t b) {
    for (Py_ssize_t c = 0; c < width; c++) {
        if (cols[c][a] != cols[c][b]) return 0;
    }
    return 1;
}

static PyObject *first_seen(PyObject *self, PyObject *args) {
    PyObject *columns;
    if (!PyArg_ParseTuple(args, "O!:first_seen", &PyTuple_Type, &columns)) return NULL;
    Py_ssize_t width = PyTuple_GET_SIZE(columns);
    if (width < 1 || width > MAX_KEY_COLUMNS) {
        PyErr_SetString(PyExc_ValueError, "first_seen takes 1..64 columns");
        return NULL;
    }
    Py_buffer views[MAX_KEY_COLUMNS];
    const int64_t *cols[MAX_KEY_COLUMNS];
    Py_ssize_t held = 0, n = 0;
    PyObject *key = NULL, *first = NULL, *result = NULL;
    int64_t *slots = NULL;  /* per slot: the key there, -1 when empty */
    for (; held < width; held++) {
        Py_ssize_t length;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(columns, held), &views[held],
                               PyBUF_C_CONTIGUOUS) < 0) goto done;
        if (!int64_array(&views[held], &length)) {
            held++;
            goto done;
        }
        if (held && length != n) {
            held++;
            PyErr_SetString(PyExc_ValueError, "first_seen's columns differ in length");
            goto done;
        }
        n = length;
        cols[held] = views[held].buf;
    }
    key = PyBytes_FromStringAndSize(NULL, n * 8);
    first = PyBytes_FromStringAndSize(NULL, n * 8);  /* at most n keys; trimmed below */
    /* A power of two at least twice the distinct rows so far: probes stay short, and
     * the table stays as small as the distinct rows (in cache for a few thousand
     * kernels), growing up to four times the rows at most. */
    size_t size = 1024;
    slots = PyMem_RawMalloc(size * sizeof(int64_t));
    if (key == NULL || first == NULL || slots == NULL) {
        if (slots == NULL) PyErr_NoMemory();
        goto done;
    }
    int64_t *k = (int64_t *)PyBytes_AS_STRING(key), *f = (int64_t *)PyBytes_AS_STRING(first);
    Py_ssize_t distinct = 0;
    int no_memory = 0;
    Py_BEGIN_ALLOW_THREADS
    memset(slots, 0xff, size * sizeof(int64_t));
    size_t mask = size - 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((size_t)distinct * 2 >= size) {  /* grow: each key again at its row's hash */
            int64_t *grown = PyMem_RawMalloc(size * 2 * sizeof(int64_t));
            if (grown == NULL) {
                no_memory = 1;
                break;
            }
            PyMem_RawFree(slots);
            slots = grown;
            size *= 2;
            mask = size - 1;
            memset(slots, 0xff, size * sizeof(int64_t));
            for (Py_ssize_t key_at = 0; key_at < distinct; key_at++) {
                size_t to = (size_t)row_hash(cols, width, f[key_at]) & mask;
                while (slots[to] >= 0) to = (to + 1) & mask;
                slots[to] = key_at;
            }
        }
        size_t at = (size_t)row_hash(cols, width, i) & mask;
        for (;;) {
            int64_t there = slots[at];
            if (there < 0) {
                slots[at] = distinct;
                f[distinct] = i;
                k[i] = distinct++;
                break;
            }
            if (same_row(cols, width, f[there], i)) {
                k[i] = there;
                break;
            }
            at = (at + 1) & mask;
        }
    }
    Py_END_ALLOW_THREADS
    if (no_memory) {
        PyErr_NoMemory();
    } else if (_PyBytes_Resize(&first, distinct * 8) == 0) {
        result = Py_BuildValue("(OO)", key, first);
    }
done:
    Py_XDECREF(key);
    Py_XDECREF(first);
    PyMem_RawFree(slots);
    for (Py_ssize_t c = 0; c < held; c++) PyBuffer_Release(&views[c]);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_line", scan_line, METH_VARARGS, scan_line_doc},
    {"contain", contain, METH_VARARGS, contain_doc},
    {"self_tree", self_tree, METH_VARARGS, self_tree_doc},
    {"first_seen", first_seen, METH_VARARGS, first_seen_doc},
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
