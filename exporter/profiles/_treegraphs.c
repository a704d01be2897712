/* The frame maker of exporter/profiles/tree_graphs.py (graphs_by_frame), compiled.
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
#include <stdint.h>

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
    PyObject **children = NULL;  /* each made row's children dict (borrowed from it) */
    /* The frames form a tree (no cycle to collect), and the collector, started by every
     * few hundred allocations, would walk the growing heap again and again: without it
     * the loop is five times faster. */
    int collecting = PyGC_Disable();
    if (ok) {
        children = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(PyObject *));
        if (children == NULL) { PyErr_NoMemory(); ok = 0; }
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
                           set_slot(PyTuple_GET_ITEM(descrs, NAME), obj,
                                    PyTuple_GET_ITEM(key, 0)) < 0 ||
                           set_slot(PyTuple_GET_ITEM(descrs, FILE_), obj,
                                    PyTuple_GET_ITEM(key, 1)) < 0 ||
                           set_slot(PyTuple_GET_ITEM(descrs, LINE), obj,
                                    PyTuple_GET_ITEM(key, 2)) < 0 ||
                           set_slot(PyTuple_GET_ITEM(descrs, CHILDREN), obj, dict) < 0 ||
                           PyDict_SetItem(children[parent[i]], key, obj) < 0) {
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
                ok = value != NULL &&
                     set_slot(PyTuple_GET_ITEM(descrs, SELF_VALUE), obj, value) == 0;
                Py_XDECREF(value);
            }
            if (ok) {
                value = PyLong_FromLongLong(total[i]);
                ok = value != NULL && set_slot(PyTuple_GET_ITEM(descrs, TOTAL), obj, value) == 0;
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
    if (collecting) PyGC_Enable();
    PyMem_Free(children);
    for (Py_ssize_t k = 0; k < got && k < 5; k++) PyBuffer_Release(&views[k]);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"make", make, METH_VARARGS, "Make the rows' Frames and link them (see the module doc)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_treegraphs",
    "The frame maker of exporter.profiles.tree_graphs, compiled.", -1, methods,
};

PyMODINIT_FUNC PyInit__treegraphs(void) { return PyModule_Create(&module); }
