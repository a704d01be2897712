/* The compiled parts of the per-step graphs: the frame maker of
 * exporter/profiles/tree_graphs.py (graphs_by_frame, make() below) and the split rule of
 * exporter/profiles/nesting.py (split(), further below), each with its Python twin.
 *
 * graphs_by_frame finds, in numpy, every frame of every window's graph with its self
 * time, total and parent, in the order the frames are made. Making the Frame objects is
 * then one small step per frame; in Python it is most of a compare's per-step graphs.
 * make() is that loop: it allocates each Frame and sets its six slots through the
 * class's own slot descriptors (so a Frame made here is one made by Frame(...)), and
 * adds it to its parent's children, the garbage collector paused meanwhile and the new
 * frames untracked by it (a tree holds no cycle; reference counts free it). The Python loop in tree_graphs.py is its twin
 * (MLPROF_DECODER=python runs it); tests/unit/test_tree_graphs.py holds them equal.
 *
 * make(frame_type, descriptors, roots, keys, window, frame, own, total, parent)
 *   frame_type   the Frame class;
 *   descriptors  its slot descriptors, a tuple in this order: name, file, line,
 *                self_value, total, children;
 *   roots        a list: each window's root Frame (made by the caller);
 *   keys         a list: each frame id's (name, file, line) tuple, its children key;
 *   window, frame, own, total, parent
 *                int64 buffers, one row per frame to make: its window, frame id (0 is
 *                the window's root: set, not made), self and total values, and the
 *                row of its parent (an earlier row).
 * Returns None. Bad input (a row past the arrays, a parent not earlier) is ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 6
enum { NAME, FILE_, LINE, SELF_VALUE, TOTAL, CHILDREN };

static int int64_view(PyObject *obj, Py_buffer *view, Py_ssize_t *n) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const char *format = view->format ? view->format : "B";
    if (*format == '<' || *format == '=' || *format == '@') format++;
    if (view->itemsize != 8 || view->len % 8 != 0 || (*format != 'q' && *format != 'l') ||
        format[1] != '\0') {
        PyErr_SetString(PyExc_ValueError, "make: expected int64 buffers");
        PyBuffer_Release(view);
        return -1;
    }
    *n = view->len / 8;
    return 0;
}

static int set_slot(PyObject *descr, PyObject *obj, PyObject *value) {
    descrsetfunc set = Py_TYPE(descr)->tp_descr_set;
    if (set == NULL) {
        PyErr_SetString(PyExc_TypeError, "make: a descriptor cannot be set");
        return -1;
    }
    return set(descr, obj, value);
}

/* ``count`` new bytes objects of ``rows`` int64 values each, into out (0), or none (-1). */
static int new_columns(PyObject **out, int count, Py_ssize_t rows) {
    for (int c = 0; c < count; c++) {
        out[c] = PyBytes_FromStringAndSize(NULL, rows * 8);
        if (out[c] == NULL) {
            for (int k = 0; k < c; k++) Py_CLEAR(out[k]);
            return -1;
        }
    }
    return 0;
}

/* The slots a made frame's values go to: written straight at the descriptors' offsets
 * when each is a plain object slot of the class (what __slots__ makes: what the
 * descriptor's own setter does, less its call and checks per value), else through the
 * descriptors. */
typedef struct {
    PyObject *descrs;
    Py_ssize_t offset[SLOTS];
    int direct;
} Slots;

static void slots_init(Slots *s, PyObject *descrs, PyTypeObject *type) {
    s->descrs = descrs;
    s->direct = 1;
    for (int k = 0; k < SLOTS; k++) {
        PyObject *d = PyTuple_GET_ITEM(descrs, k);
        if (Py_TYPE(d) != &PyMemberDescr_Type || !PyType_IsSubtype(type, PyDescr_TYPE(d))) {
            s->direct = 0;
            return;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)d)->d_member;
        if (member->type != T_OBJECT_EX || (member->flags & READONLY)) {
            s->direct = 0;
            return;
        }
        s->offset[k] = member->offset;
    }
}

static inline int put(const Slots *s, int k, PyObject *obj, PyObject *value) {
    if (!s->direct) return set_slot(PyTuple_GET_ITEM(s->descrs, k), obj, value);
    PyObject **at = (PyObject **)((char *)obj + s->offset[k]);
    PyObject *old = *at;
    Py_INCREF(value);
    *at = value;
    Py_XDECREF(old);
    return 0;
}

/* ``frame`` into its parent's children under ``key``, whose hash is worked out once per
 * key (a key is made in many windows; a tuple's hash is not cached by CPython). */
static int add_child(PyObject *dict, PyObject *key, PyObject *frame, Py_hash_t *hash) {
#if PY_VERSION_HEX < 0x030D0000
    if (*hash == -1 && (*hash = PyObject_Hash(key)) == -1) return -1;
    return _PyDict_SetItem_KnownHash(dict, key, frame, *hash);
#else
    (void)hash;
    return PyDict_SetItem(dict, key, frame);
#endif
}

static PyObject *make(PyObject *self, PyObject *args) {
    PyTypeObject *type;
    PyObject *descrs, *roots, *keys, *arrays[5];
    if (!PyArg_ParseTuple(args, "O!O!O!O!OOOOO", &PyType_Type, &type, &PyTuple_Type, &descrs,
                          &PyList_Type, &roots, &PyList_Type, &keys, &arrays[0], &arrays[1],
                          &arrays[2], &arrays[3], &arrays[4]))
        return NULL;
    if (PyTuple_GET_SIZE(descrs) != SLOTS) {
        PyErr_SetString(PyExc_ValueError, "make: expected 6 slot descriptors");
        return NULL;
    }
    Py_buffer views[5];
    Py_ssize_t n = -1, got = 0;
    int ok = 1;
    for (got = 0; got < 5; got++) {
        Py_ssize_t len;
        if (int64_view(arrays[got], &views[got], &len) < 0) { ok = 0; break; }
        if (n >= 0 && len != n) {
            PyErr_SetString(PyExc_ValueError, "make: arrays of different lengths");
            got++;
            ok = 0;
            break;
        }
        n = len;
    }
    Slots slots;
    slots_init(&slots, descrs, type);
    Py_hash_t *hashes = NULL;  /* each key's hash, -1 until its first frame is made */
    PyObject **children = NULL;  /* each made row's children dict (borrowed from it) */
    /* The frames form a tree (no cycle to collect), and the collector, started by every
     * few hundred allocations, would walk the growing heap again and again: without it
     * the loop is five times faster. */
    int collecting = PyGC_Disable();
    if (ok) {
        Py_ssize_t n_keys = PyList_GET_SIZE(keys);
        children = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(PyObject *));
        hashes = PyMem_Malloc((size_t)(n_keys ? n_keys : 1) * sizeof(Py_hash_t));
        if (children == NULL || hashes == NULL) { PyErr_NoMemory(); ok = 0; }
        for (Py_ssize_t k = 0; ok && k < n_keys; k++) hashes[k] = -1;
    }
    if (ok) {
        const int64_t *window = views[0].buf, *frame = views[1].buf, *own = views[2].buf;
        const int64_t *total = views[3].buf, *parent = views[4].buf;
        Py_ssize_t n_roots = PyList_GET_SIZE(roots), n_keys = PyList_GET_SIZE(keys);
        for (Py_ssize_t i = 0; i < n && ok; i++) {
            PyObject *obj = NULL, *value = NULL;
            if (window[i] < 0 || window[i] >= n_roots || frame[i] < 0 || frame[i] >= n_keys ||
                (frame[i] != 0 && (parent[i] < 0 || parent[i] >= i))) {
                PyErr_SetString(PyExc_ValueError, "make: a row out of range");
                ok = 0;
                break;
            }
            if (frame[i] == 0) {  /* the window's root: given, its values set */
                obj = PyList_GET_ITEM(roots, window[i]);
                Py_INCREF(obj);
            } else {
                PyObject *key = PyList_GET_ITEM(keys, frame[i]);
                PyObject *dict = PyDict_New();
                obj = type->tp_alloc(type, 0);
                if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 3) {
                    PyErr_SetString(PyExc_ValueError, "make: a key is not (name, file, line)");
                    ok = 0;
                } else if (dict == NULL || obj == NULL ||
                           put(&slots, NAME, obj, PyTuple_GET_ITEM(key, 0)) < 0 ||
                           put(&slots, FILE_, obj, PyTuple_GET_ITEM(key, 1)) < 0 ||
                           put(&slots, LINE, obj, PyTuple_GET_ITEM(key, 2)) < 0 ||
                           put(&slots, CHILDREN, obj, dict) < 0 ||
                           add_child(children[parent[i]], key, obj, &hashes[frame[i]]) < 0) {
                    ok = 0;
                }
                children[i] = dict;  /* borrowed from here on: the frame holds it */
                Py_XDECREF(dict);
                if (ok) {
                    /* A tree of frames holds no reference cycle, and reference counts free
                     * it: the collector need not walk its hundreds of thousands of objects
                     * at every collection (most of a compare's read, past the make loop).
                     * Freeing stays with the counts; only a cycle someone made through
                     * these frames would never be collected, and no FlameGraph makes one.
                     * A dict is tracked again by CPython when a container goes into it. */
                    PyObject_GC_UnTrack(obj);
                    PyObject_GC_UnTrack(dict);
                }
            }
            if (ok) {
                value = PyLong_FromLongLong(own[i]);
                ok = value != NULL && put(&slots, SELF_VALUE, obj, value) == 0;
                if (ok && total[i] != own[i]) {  /* a leaf's total is its self: one int */
                    Py_DECREF(value);
                    value = PyLong_FromLongLong(total[i]);
                }
                ok = ok && value != NULL && put(&slots, TOTAL, obj, value) == 0;
                Py_XDECREF(value);
            }
            if (ok && frame[i] == 0) {  /* a root's children: alive as long as the root */
                PyObject *dict = PyObject_GetAttrString(obj, "children");
                ok = dict != NULL && PyDict_Check(dict);
                if (dict != NULL && !ok) {
                    PyErr_SetString(PyExc_TypeError, "make: children is not a dict");
                }
                children[i] = dict;
                Py_XDECREF(dict);  /* borrowed from here on: the root holds it */
            }
            Py_XDECREF(obj);  /* the frame lives in its parent's children (or is a root) */
        }
    }
    /* CPython tracks a dict again when a frame goes into it (any object of a collected
     * type may hold a cycle, as far as it can tell): every inner frame's children dict
     * was, and the next collection walked tens of thousands of them (2 ms a compare's
     * step graphs, at every collection while they lived). They hold frames and
     * (name, file, line) keys only: no cycle, as for the frames themselves. */
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        const int64_t *frame = views[1].buf;
        if (frame[i] != 0 && children[i] != NULL && PyObject_GC_IsTracked(children[i])) {
            PyObject_GC_UnTrack(children[i]);
        }
    }
    if (collecting) PyGC_Enable();
    PyMem_Free(children);
    PyMem_Free(hashes);
    for (Py_ssize_t k = 0; k < got && k < 5; k++) PyBuffer_Release(&views[k]);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* rows(frame_of, frame_parent, node, window, ns, count)
 *   -> (window, frame, own, total, parent)
 *
 * The rows graphs_by_frame makes frames from (tree_graphs.py; its numpy twin there):
 * for each window in order, each node carrying time (ns > 0) in node order, the frames
 * on the way from the root to the node's frame that the window has not made yet, made
 * top-down (a frame is made where the first node below it is reached, its ancestors
 * first, as graphs_by_node's walk makes them). own sums each frame's ns; total adds
 * each frame's own and its children's (in the wrapping arithmetic of numpy's int64).
 * parent is the row of the frame's parent (0 for a root row: make does not read it).
 *   frame_of     int64 per node: its frame (frame 0 the root);
 *   frame_parent int64 per frame: its parent frame, an earlier frame (-1 for the root);
 *   node, window, ns  int64, one entry per (node, window) value, in any order;
 *   count        the number of windows.
 * Rows are as many as the graphs' frames, which the caller makes next. Ids out of
 * range, or a parent that is not an earlier frame, are ValueError. */
typedef struct { int64_t window, node, ns; } Entry;

static int by_window_node(const void *a, const void *b) {
    const Entry *x = a, *y = b;
    if (x->window != y->window) return x->window < y->window ? -1 : 1;
    return (x->node > y->node) - (x->node < y->node);
}

static PyObject *rows(PyObject *self, PyObject *args) {
    PyObject *objs[5];
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "OOOOOn:rows", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &count))
        return NULL;
    Py_buffer views[5];
    Py_ssize_t lens[5];
    int got = 0;
    PyObject *result = NULL;
    Entry *entries = NULL;
    Py_ssize_t *per_window = NULL;
    int64_t *made_in = NULL, *row_of = NULL, *chain = NULL;
    int64_t *cols[5];  /* window, frame, own, total, parent of each row: the result's */
    for (got = 0; got < 5; got++) {
        if (int64_view(objs[got], &views[got], &lens[got]) < 0) goto done;
    }
    Py_ssize_t n_nodes = lens[0], n_frames = lens[1], n = lens[2];
    if (lens[3] != n || lens[4] != n || count < 0) {
        PyErr_SetString(PyExc_ValueError, "rows: arrays of different lengths");
        goto done;
    }
    const int64_t *frame_of = views[0].buf, *f_parent = views[1].buf;
    const int64_t *node = views[2].buf, *window = views[3].buf, *ns = views[4].buf;
    for (Py_ssize_t f = 0; f < n_frames; f++) {
        if (f == 0 ? f_parent[f] != -1 : (f_parent[f] < 0 || f_parent[f] >= f)) {
            PyErr_SetString(PyExc_ValueError, "rows: a frame's parent is not an earlier frame");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n_nodes; i++) {
        if (frame_of[i] < 0 || frame_of[i] >= n_frames) {
            PyErr_SetString(PyExc_ValueError, "rows: a node's frame out of range");
            goto done;
        }
    }
    per_window = PyMem_Calloc((size_t)count + 1, sizeof(Py_ssize_t));
    made_in = PyMem_Malloc((size_t)(n_frames ? n_frames : 1) * sizeof(int64_t));
    row_of = PyMem_Malloc((size_t)(n_frames ? n_frames : 1) * sizeof(int64_t));
    chain = PyMem_Malloc((size_t)(n_frames ? n_frames : 1) * sizeof(int64_t));
    if (!per_window || !made_in || !row_of || !chain) {
        PyErr_NoMemory();
        goto done;
    }
    /* Windows in order (a stable counting sort: values come node by node, so each
     * window's nodes are in order already), nodes in order in each (sorted where they are
     * not; equal pairs add to one frame). Values without time have no frame of their own
     * (as the twin keeps ns > 0). */
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ns[i] <= 0) continue;
        if (node[i] < 0 || node[i] >= n_nodes || window[i] < 0 || window[i] >= count) {
            PyErr_SetString(PyExc_ValueError, "rows: a node or window out of range");
            goto done;
        }
        per_window[window[i] + 1]++;
        m++;
    }
    entries = PyMem_Malloc((size_t)(m ? m : 1) * sizeof(Entry));
    if (entries == NULL) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t w = 0; w < count; w++) per_window[w + 1] += per_window[w];
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ns[i] <= 0) continue;
        Entry *at = &entries[per_window[window[i]]++];
        at->window = window[i], at->node = node[i], at->ns = ns[i];
    }
    for (Py_ssize_t lo = 0, hi; lo < m; lo = hi) {
        int in_order = 1;
        for (hi = lo + 1; hi < m && entries[hi].window == entries[lo].window; hi++) {
            in_order &= entries[hi - 1].node <= entries[hi].node;
        }
        if (!in_order) qsort(entries + lo, (size_t)(hi - lo), sizeof(Entry), by_window_node);
    }
    /* The rows counted by one walk, then made by a second straight into the result. */
    Py_ssize_t n_rows = 0;
    for (Py_ssize_t f = 0; f < n_frames; f++) made_in[f] = -1;
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t w = entries[i].window;
        for (int64_t g = frame_of[entries[i].node]; g >= 0 && made_in[g] != w; g = f_parent[g]) {
            made_in[g] = w;
            n_rows++;
        }
    }
    PyObject *out[5];
    if (new_columns(out, 5, n_rows) < 0) goto done;
    for (int c = 0; c < 5; c++) cols[c] = (int64_t *)PyBytes_AS_STRING(out[c]);
    for (Py_ssize_t f = 0; f < n_frames; f++) made_in[f] = -1;
    n_rows = 0;
    Py_ssize_t window_start = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t w = entries[i].window;
        int64_t f = frame_of[entries[i].node];
        Py_ssize_t k = 0;
        for (int64_t g = f; g >= 0 && made_in[g] != w; g = f_parent[g]) chain[k++] = g;
        if (k && chain[k - 1] == 0) window_start = n_rows;  /* the window's root: its first row */
        while (k--) {
            int64_t g = chain[k];
            cols[0][n_rows] = w;
            cols[1][n_rows] = g;
            cols[2][n_rows] = 0;
            cols[3][n_rows] = 0;
            cols[4][n_rows] = g == 0 ? 0 : row_of[f_parent[g]];
            row_of[g] = n_rows;
            made_in[g] = w;
            n_rows++;
        }
        uint64_t own = (uint64_t)cols[2][row_of[f]] + (uint64_t)entries[i].ns;
        cols[2][row_of[f]] = (int64_t)own;
        if (i + 1 == m || entries[i + 1].window != w) {
            /* The window is made: totals from the last row up (children after parents). */
            for (Py_ssize_t r = n_rows - 1; r >= window_start; r--) {
                uint64_t total = (uint64_t)cols[3][r] + (uint64_t)cols[2][r];
                cols[3][r] = (int64_t)total;
                if (cols[1][r] != 0) {
                    Py_ssize_t up = cols[4][r];
                    cols[3][up] = (int64_t)((uint64_t)cols[3][up] + total);
                }
            }
        }
    }
    result = Py_BuildValue("(NNNNN)", out[0], out[1], out[2], out[3], out[4]);
done:
    PyMem_Free(entries);
    PyMem_Free(per_window);
    PyMem_Free(made_in);
    PyMem_Free(row_of);
    PyMem_Free(chain);
    for (int k = 0; k < got; k++) PyBuffer_Release(&views[k]);
    return result;
}

/* window_self(start, end, parent, node, window_start, window_end) -> (node, window, ps)
 *
 * nesting.window_self compiled (its numpy twin there, held equal by
 * tests/unit/test_window_self_compiled.py): each segment of a line adds its overlap with
 * each window to its node there and takes it from its parent segment's node. Windows
 * are sorted and disjoint; a segment finds its first and last window by binary search.
 * The result is the sparse sum per (node, window), as int64 array bytes ordered by
 * (node, window), pairs with a zero sum included as numpy's aggregate keeps them; sums
 * wrap as numpy's int64 does. Entries are as many as the twin's (one per segment and
 * window it overlaps, twice below a parent): the same memory bound. */
typedef struct { int64_t key, value; } Pair;

static int by_key(const void *a, const void *b) {
    const Pair *x = a, *y = b;
    return (x->key > y->key) - (x->key < y->key);
}

static Py_ssize_t first_end_after(const int64_t *w_end, Py_ssize_t k, int64_t t) {
    Py_ssize_t lo = 0, hi = k;  /* numpy's searchsorted(w_end, t, "right") */
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (w_end[mid] <= t) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static Py_ssize_t first_start_from(const int64_t *w_start, Py_ssize_t k, int64_t t) {
    Py_ssize_t lo = 0, hi = k;  /* numpy's searchsorted(w_start, t, "left") */
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (w_start[mid] < t) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static PyObject *window_self(PyObject *self, PyObject *args) {
    PyObject *objs[6];
    if (!PyArg_ParseTuple(args, "OOOOOO:window_self", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5]))
        return NULL;
    Py_buffer views[6];
    Py_ssize_t lens[6];
    int got;
    PyObject *result = NULL;
    Pair *pairs = NULL;
    Py_ssize_t *span_of = NULL;
    uint64_t *dense = NULL;
    uint8_t *present = NULL;
    for (got = 0; got < 6; got++) {
        if (int64_view(objs[got], &views[got], &lens[got]) < 0) goto done;
    }
    Py_ssize_t n = lens[0], k = lens[4];
    if (lens[1] != n || lens[2] != n || lens[3] != n || lens[5] != k) {
        PyErr_SetString(PyExc_ValueError, "window_self: arrays of different lengths");
        goto done;
    }
    const int64_t *start = views[0].buf, *end = views[1].buf, *parent = views[2].buf;
    const int64_t *node = views[3].buf, *w_start = views[4].buf, *w_end = views[5].buf;
    int64_t max_node = 0;
    Py_ssize_t total = 0;
    /* Each segment's first and last window, found once (both passes read them). */
    span_of = PyMem_Malloc((size_t)(n ? n : 1) * 2 * sizeof(Py_ssize_t));
    if (span_of == NULL) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (node[i] < 0 || parent[i] < -1 || parent[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "window_self: a node or parent out of range");
            goto done;
        }
        if (node[i] > max_node) max_node = node[i];
        Py_ssize_t first = span_of[2 * i] = first_end_after(w_end, k, start[i]);
        Py_ssize_t last = span_of[2 * i + 1] = first_start_from(w_start, k, end[i]) - 1;
        if (last >= first) total += (last - first + 1) * (parent[i] >= 0 ? 2 : 1);
    }
    if (k && max_node > (INT64_MAX - k) / k) {
        PyErr_SetString(PyExc_ValueError, "window_self: node ids too large");
        goto done;
    }
    /* Keys node * k + window: summed in a table where it is small beside the entries,
     * else sorted (the twin's dense_index makes the same choice by its own rule). */
    uint64_t span = (uint64_t)(max_node + 1) * (uint64_t)(k ? k : 1);
    int use_table = span <= (uint64_t)4 * (uint64_t)total + 65536 && span <= ((uint64_t)1 << 26);
    if (use_table) {
        dense = PyMem_Calloc((size_t)span, sizeof(uint64_t));
        present = PyMem_Calloc((size_t)span, 1);
        if (!dense || !present) { PyErr_NoMemory(); goto done; }
    } else {
        pairs = PyMem_Malloc((size_t)(total ? total : 1) * sizeof(Pair));
        if (!pairs) { PyErr_NoMemory(); goto done; }
    }
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t first = span_of[2 * i], last = span_of[2 * i + 1];
        for (Py_ssize_t j = first; j <= last; j++) {
            int64_t lo = start[i] > w_start[j] ? start[i] : w_start[j];
            int64_t hi = end[i] < w_end[j] ? end[i] : w_end[j];
            uint64_t overlap = (uint64_t)hi - (uint64_t)lo;
            int64_t mine = node[i] * k + j;
            if (use_table) {
                dense[mine] += overlap;
                present[mine] = 1;
            } else {
                pairs[m].key = mine;
                pairs[m++].value = (int64_t)overlap;
            }
            if (parent[i] >= 0) {
                int64_t theirs = node[parent[i]] * k + j;
                if (use_table) {
                    dense[theirs] -= overlap;
                    present[theirs] = 1;
                } else {
                    pairs[m].key = theirs;
                    pairs[m++].value = (int64_t)(0 - overlap);
                }
            }
        }
    }
    Py_ssize_t distinct = 0;
    if (use_table) {
        for (uint64_t key = 0; key < span; key++) distinct += present[key];
    } else {
        qsort(pairs, (size_t)m, sizeof(Pair), by_key);
        for (Py_ssize_t i = 0; i < m; i++) distinct += i == 0 || pairs[i].key != pairs[i - 1].key;
    }
    PyObject *out[3];
    if (new_columns(out, 3, distinct) < 0) goto done;
    int64_t *o_node = (int64_t *)PyBytes_AS_STRING(out[0]);
    int64_t *o_window = (int64_t *)PyBytes_AS_STRING(out[1]);
    int64_t *o_sum = (int64_t *)PyBytes_AS_STRING(out[2]);
    Py_ssize_t r = 0;
    if (use_table) {
        for (uint64_t key = 0; key < span; key++) {
            if (!present[key]) continue;
            o_node[r] = (int64_t)(key / (uint64_t)k);
            o_window[r] = (int64_t)(key % (uint64_t)k);
            o_sum[r++] = (int64_t)dense[key];
        }
    } else {
        for (Py_ssize_t i = 0; i < m; i++) {
            if (i == 0 || pairs[i].key != pairs[i - 1].key) {
                o_node[r] = pairs[i].key / k;
                o_window[r] = pairs[i].key % k;
                o_sum[r++] = 0;
            }
            o_sum[r - 1] = (int64_t)((uint64_t)o_sum[r - 1] + (uint64_t)pairs[i].value);
        }
    }
    result = Py_BuildValue("(NNN)", out[0], out[1], out[2]);
done:
    PyMem_Free(pairs);
    PyMem_Free(span_of);
    PyMem_Free(dense);
    PyMem_Free(present);
    for (int c = 0; c < got; c++) PyBuffer_Release(&views[c]);
    return result;
}

/* segment_nodes(parent, depth, tuples, max_depth, cut) -> (parent, tuple, level, node)
 *
 * The frame-tree node of each of a line's nested segments, as FrameTree.assign finds
 * them in numpy level by level (its twin, xplane.py; tests/unit/test_segment_nodes.py
 * holds them equal through the graphs): a segment's node is (its parent segment's node,
 * its tuple), ``cut`` at depth ``max_depth``, its parent's node deeper, and its parent's
 * node (the root at the top) where its tuple is -1 (folded). Nodes are numbered here in
 * the order segments reach them, node 0 the line's root; the caller interns them in its
 * own tree level by level, as assign does (a node's level: the least depth reaching it).
 * Returns (parent, tuple, level) of nodes 1.. and each segment's node, int64 array
 * bytes; None where a tuple lies outside 0..2**31 (the caller's numpy handles it). A
 * parent not before its segment is ValueError. Nodes are at most one per segment. */
typedef struct {
    int64_t *parent, *tuple, *level;
    Py_ssize_t count, capacity;
    int64_t *slots;  /* node index per slot, -1 empty: at most half full */
    size_t mask;
} Interned;

static inline size_t pair_slot(const Interned *t, int64_t parent, int64_t tuple) {
    uint64_t x = ((uint64_t)parent << 32 ^ (uint64_t)tuple) * 0x9E3779B97F4A7C15ULL;
    return (size_t)(x ^ x >> 29) & t->mask;
}

static int interned_grow(Interned *t) {
    Py_ssize_t capacity = t->capacity * 2;
    int64_t **cols[3] = {&t->parent, &t->tuple, &t->level};
    for (int c = 0; c < 3; c++) {
        int64_t *more = PyMem_Realloc(*cols[c], (size_t)capacity * sizeof(int64_t));
        if (more == NULL) return -1;
        *cols[c] = more;
    }
    int64_t *slots = PyMem_Malloc((size_t)capacity * 2 * sizeof(int64_t));
    if (slots == NULL) return -1;
    PyMem_Free(t->slots);
    t->slots = slots;
    t->capacity = capacity;
    t->mask = (size_t)capacity * 2 - 1;
    memset(slots, 0xff, (size_t)capacity * 2 * sizeof(int64_t));
    for (Py_ssize_t k = 0; k < t->count; k++) {
        size_t at = pair_slot(t, t->parent[k], t->tuple[k]);
        while (slots[at] >= 0) at = (at + 1) & t->mask;
        slots[at] = k;
    }
    return 0;
}

/* The node of (parent, tuple), found or made at ``level``; -1 when out of memory. */
static int64_t intern_pair(Interned *t, int64_t parent, int64_t tuple, int64_t level) {
    size_t at = pair_slot(t, parent, tuple);
    for (int64_t there; (there = t->slots[at]) >= 0; at = (at + 1) & t->mask) {
        if (t->parent[there] == parent && t->tuple[there] == tuple) {
            if (level < t->level[there]) t->level[there] = level;
            return there;
        }
    }
    if (t->count == t->capacity) {
        if (interned_grow(t) < 0) return -1;
        at = pair_slot(t, parent, tuple);
        while (t->slots[at] >= 0) at = (at + 1) & t->mask;
    }
    int64_t made = t->count++;
    t->parent[made] = parent, t->tuple[made] = tuple, t->level[made] = level;
    t->slots[at] = made;
    return made;
}

static PyObject *segment_nodes(PyObject *self, PyObject *args) {
    PyObject *objs[3];
    long long max_depth, cut;
    if (!PyArg_ParseTuple(args, "OOOLL:segment_nodes", &objs[0], &objs[1], &objs[2],
                          &max_depth, &cut))
        return NULL;
    Py_buffer views[3];
    Py_ssize_t lens[3];
    int got;
    PyObject *result = NULL, *local_bytes = NULL;
    Interned t = {0};
    for (got = 0; got < 3; got++) {
        if (int64_view(objs[got], &views[got], &lens[got]) < 0) goto done;
    }
    Py_ssize_t n = lens[0];
    if (lens[1] != n || lens[2] != n) {
        PyErr_SetString(PyExc_ValueError, "segment_nodes: arrays of different lengths");
        goto done;
    }
    if (cut < 0 || cut >= ((long long)1 << 31)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    const int64_t *parent = views[0].buf, *depth = views[1].buf, *tuple = views[2].buf;
    t.capacity = 512;
    t.mask = 1023;
    t.parent = PyMem_Malloc(512 * sizeof(int64_t));
    t.tuple = PyMem_Malloc(512 * sizeof(int64_t));
    t.level = PyMem_Malloc(512 * sizeof(int64_t));
    t.slots = PyMem_Malloc(1024 * sizeof(int64_t));
    local_bytes = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!t.parent || !t.tuple || !t.level || !t.slots || !local_bytes) {
        if (local_bytes != NULL) PyErr_NoMemory();
        goto done;
    }
    memset(t.slots, 0xff, 1024 * sizeof(int64_t));
    t.count = 1;  /* the root */
    t.parent[0] = -1, t.tuple[0] = -1, t.level[0] = -1;
    int64_t *local = (int64_t *)PyBytes_AS_STRING(local_bytes);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t up = parent[i];
        if (up >= i || up < -1) {
            PyErr_SetString(PyExc_ValueError, "segment_nodes: a segment's parent is not before it");
            goto done;
        }
        int64_t above = up >= 0 ? local[up] : 0;
        int64_t tid = depth[i] == max_depth ? cut : tuple[i];
        if (depth[i] > max_depth || (tid == -1 && depth[i] < max_depth)) {
            local[i] = above;  /* deeper than the cap: the cap's node; folded: the parent's */
            continue;
        }
        if (tid < 0 || tid >= ((int64_t)1 << 31)) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        if ((local[i] = intern_pair(&t, above, tid, depth[i])) < 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    Py_ssize_t made = t.count - 1;
    PyObject *cols[3];
    const int64_t *sources[3] = {t.parent + 1, t.tuple + 1, t.level + 1};
    for (int c = 0; c < 3; c++) {
        cols[c] = PyBytes_FromStringAndSize((const char *)sources[c], made * 8);
    }
    if (cols[0] && cols[1] && cols[2]) {
        result = Py_BuildValue("(OOOO)", cols[0], cols[1], cols[2], local_bytes);
    }
    for (int c = 0; c < 3; c++) Py_XDECREF(cols[c]);
done:
    Py_XDECREF(local_bytes);
    PyMem_Free(t.parent);
    PyMem_Free(t.tuple);
    PyMem_Free(t.level);
    PyMem_Free(t.slots);
    for (int c = 0; c < got; c++) PyBuffer_Release(&views[c]);
    return result;
}

/* split(start, end, reorder_above, budget) -> (start, end, event, parent, depth)
 *
 * The ``split`` rule of exporter/profiles/nesting.py, compiled: its twin is
 * nesting._split_loop, step for step (tests/unit/test_split_compiled.py holds them
 * equal). start and end are int64 buffers of one line's events sorted by start; the
 * result is int64 array bytes per segment kept (those that carry time), in the twin's
 * order: its start, end, event index (the caller maps it to the event's label), parent
 * segment (-1 at the top) and depth. More than ``budget`` segments is ValueError, as the
 * twin raises it: memory stays within budget segments whatever the input. */
typedef struct {
    int64_t *start, *end, *item, *parent;
    Py_ssize_t count, capacity;
} Segments;

typedef struct {
    const int64_t *end;   /* each event's end */
    int64_t *seg;         /* each open event's current segment */
    int64_t *stack;       /* open events (their index), bottom first */
    Py_ssize_t top;
    int64_t *heap;        /* open events by (end, index): the next to end first */
    Py_ssize_t heap_n;
    int64_t *sorting;     /* scratch for a reorder */
    Segments segs;
    Py_ssize_t reorder_above, budget, events;
} Sweep;

static int heap_less(const Sweep *w, int64_t a, int64_t b) {
    return w->end[a] < w->end[b] || (w->end[a] == w->end[b] && a < b);
}

static void heap_push(Sweep *w, int64_t item) {
    Py_ssize_t i = w->heap_n++;
    while (i > 0) {
        Py_ssize_t up = (i - 1) / 2;
        if (!heap_less(w, item, w->heap[up])) break;
        w->heap[i] = w->heap[up];
        i = up;
    }
    w->heap[i] = item;
}

static int64_t heap_pop(Sweep *w) {
    int64_t out = w->heap[0], last = w->heap[--w->heap_n];
    Py_ssize_t i = 0, n = w->heap_n;
    for (;;) {
        Py_ssize_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && heap_less(w, w->heap[child + 1], w->heap[child])) child++;
        if (!heap_less(w, w->heap[child], last)) break;
        w->heap[i] = w->heap[child];
        i = child;
    }
    if (n) w->heap[i] = last;
    return out;
}

static int open_segment(Sweep *w, int64_t at, int64_t item, Py_ssize_t below) {
    Segments *s = &w->segs;
    if (s->count == s->capacity) {
        Py_ssize_t grown = s->capacity * 2;
        int64_t **cols[4] = {&s->start, &s->end, &s->item, &s->parent};
        for (int c = 0; c < 4; c++) {
            int64_t *more = PyMem_Realloc(*cols[c], (size_t)grown * sizeof(int64_t));
            if (more == NULL) { PyErr_NoMemory(); return -1; }
            *cols[c] = more;
        }
        s->capacity = grown;
    }
    w->seg[item] = s->count;
    s->start[s->count] = at;
    s->end[s->count] = at;
    s->item[s->count] = item;
    s->parent[s->count] = below >= 0 ? w->seg[w->stack[below]] : -1;
    s->count++;
    return 0;
}

static int reopen(Sweep *w, int64_t at, Py_ssize_t low) {
    for (Py_ssize_t p = low; p < w->top; p++) {
        if (open_segment(w, at, w->stack[p], p - 1) < 0) return -1;
    }
    if (w->segs.count > w->budget) {
        PyErr_Format(PyExc_ValueError,
                     "%zd overlapping events split into more than %zd segments (more than "
                     "the split rule's bound): refused", w->events, w->budget);
        return -1;
    }
    return 0;
}

static const int64_t *sort_end;  /* the reorder's comparison reads it (one thread: GIL held) */

static int later_end_first(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    if (sort_end[x] != sort_end[y]) return sort_end[x] > sort_end[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int close_until(Sweep *w, int64_t t) {
    while (w->heap_n && w->end[w->heap[0]] <= t) {
        int64_t item = heap_pop(w), at = w->end[item];
        Py_ssize_t pos = w->top - 1;
        while (w->stack[pos] != item) pos--;
        for (Py_ssize_t k = pos; k < w->top; k++) w->segs.end[w->seg[w->stack[k]]] = at;
        memmove(w->stack + pos, w->stack + pos + 1, (size_t)(w->top - pos - 1) * sizeof(int64_t));
        w->top--;
        Py_ssize_t moved = w->top - pos;
        if (moved <= w->reorder_above) {  /* the rule: those above continue one level up */
            if (reopen(w, at, pos) < 0) return -1;
            continue;
        }
        int64_t latest = INT64_MIN;
        for (Py_ssize_t k = pos; k < w->top; k++) {
            if (w->end[w->stack[k]] > latest) latest = w->end[w->stack[k]];
        }
        Py_ssize_t low = pos;
        while (low > 0 && pos - low < moved && w->end[w->stack[low - 1]] < latest) {
            low--;
            w->segs.end[w->seg[w->stack[low]]] = at;
        }
        sort_end = w->end;
        qsort(w->stack + low, (size_t)(w->top - low), sizeof(int64_t), later_end_first);
        if (reopen(w, at, low) < 0) return -1;
    }
    return 0;
}

static PyObject *split(PyObject *self, PyObject *args) {
    PyObject *start_obj, *end_obj;
    Py_ssize_t reorder_above, budget;
    if (!PyArg_ParseTuple(args, "OOnn:split", &start_obj, &end_obj, &reorder_above, &budget))
        return NULL;
    Py_buffer sv, ev;
    Py_ssize_t n, n_end;
    if (int64_view(start_obj, &sv, &n) < 0) return NULL;
    if (int64_view(end_obj, &ev, &n_end) < 0) { PyBuffer_Release(&sv); return NULL; }
    PyObject *result = NULL;
    Sweep w = {0};
    int64_t *keep_index = NULL;
    if (n != n_end) {
        PyErr_SetString(PyExc_ValueError, "split: start and end differ in length");
        goto done;
    }
    const int64_t *start = sv.buf;
    size_t room = (size_t)(n ? n : 1) * sizeof(int64_t);
    w.end = ev.buf;
    w.reorder_above = reorder_above;
    w.budget = budget;
    w.events = n;
    w.seg = PyMem_Malloc(room);
    w.stack = PyMem_Malloc(room);
    w.heap = PyMem_Malloc(room);
    w.segs.capacity = n + 16;
    int64_t **cols[4] = {&w.segs.start, &w.segs.end, &w.segs.item, &w.segs.parent};
    int ok = w.seg && w.stack && w.heap;
    for (int c = 0; c < 4 && ok; c++) {
        *cols[c] = PyMem_Malloc((size_t)w.segs.capacity * sizeof(int64_t));
        ok = *cols[c] != NULL;
    }
    if (!ok) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (close_until(&w, start[i]) < 0) goto done;
        if (open_segment(&w, start[i], i, w.top - 1) < 0) goto done;
        w.stack[w.top++] = i;
        heap_push(&w, i);
    }
    if (close_until(&w, (int64_t)1 << 62) < 0) goto done;  /* nesting.FAR */
    /* Segments reopened and closed at one instant carry no time (nor do their children,
     * inside them): dropped, parents renumbered, depths from the parents (which come
     * first), as the twin does in numpy. */
    Segments *s = &w.segs;
    keep_index = PyMem_Malloc((size_t)(s->count ? s->count : 1) * sizeof(int64_t));
    if (keep_index == NULL) { PyErr_NoMemory(); goto done; }
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < s->count; i++) {
        if (s->end[i] > s->start[i]) kept++;
        keep_index[i] = kept - 1;  /* numpy's cumsum(keep) - 1 */
    }
    PyObject *out[5];
    if (new_columns(out, 5, kept) < 0) goto done;
    int64_t *o_start = (int64_t *)PyBytes_AS_STRING(out[0]);
    int64_t *o_end = (int64_t *)PyBytes_AS_STRING(out[1]);
    int64_t *o_item = (int64_t *)PyBytes_AS_STRING(out[2]);
    int64_t *o_parent = (int64_t *)PyBytes_AS_STRING(out[3]);
    int64_t *o_depth = (int64_t *)PyBytes_AS_STRING(out[4]);
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; i < s->count; i++) {
        if (s->end[i] <= s->start[i]) continue;
        int64_t parent = s->parent[i] >= 0 ? keep_index[s->parent[i]] : -1;
        o_start[j] = s->start[i];
        o_end[j] = s->end[i];
        o_item[j] = s->item[i];
        o_parent[j] = parent;
        o_depth[j] = parent >= 0 ? o_depth[parent] + 1 : 0;
        j++;
    }
    result = Py_BuildValue("(NNNNN)", out[0], out[1], out[2], out[3], out[4]);
done:
    PyMem_Free(keep_index);
    PyMem_Free(w.seg);
    PyMem_Free(w.stack);
    PyMem_Free(w.heap);
    PyMem_Free(w.segs.start);
    PyMem_Free(w.segs.end);
    PyMem_Free(w.segs.item);
    PyMem_Free(w.segs.parent);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&ev);
    return result;
}

static PyMethodDef methods[] = {
    {"make", make, METH_VARARGS, "Make the rows' Frames and link them (see the module doc)."},
    {"split", split, METH_VARARGS, "Nest a line's events by the split rule (see above)."},
    {"rows", rows, METH_VARARGS, "The rows graphs_by_frame makes frames from (see above)."},
    {"window_self", window_self, METH_VARARGS, "Self time per (node, window) (see above)."},
    {"segment_nodes", segment_nodes, METH_VARARGS, "Each segment's frame-tree node (see above)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_treegraphs",
    "The compiled parts of exporter.profiles.tree_graphs and nesting (make, split).", -1, methods,
};

PyMODINIT_FUNC PyInit__treegraphs(void) { return PyModule_Create(&module); }
