/* The history journal's writer for pvwire (core/history.py): one update of a recorded channel
 * into four columns, in C.
 *
 * Why compiled: from Python, the four item writes took ~190 ns of `Channel.on_update` in a loop
 * of one channel, this call ~55 ns (recording's whole cost there went from +323 to +182 ns,
 * bench/history.py, 2026-11-25). In a server of 1,000 CA channels, timed around the recording
 * lines on the event loop, recording took ~500 ns per update with the Python writes and ~300 ns
 * with this call (both with the journal's flush, 2026-11-25).
 *
 * history.py keeps a Python writer with the same behaviour (`PyWriter`) for a checkout where
 * this module is not built; tests/test_journal.py runs the same cases against both.
 *
 * Nothing here keeps a reference to a Python object but the four buffers, released with the
 * writer. Every call runs with the GIL held, on whichever thread calls it.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NS 1000000000LL

typedef struct {
    PyObject_HEAD
    Py_buffer t, v, a, c; /* int64 time (ns), float64 value, uint16 alarm, int32 slot */
    Py_ssize_t j;         /* where the next point goes */
    Py_ssize_t size;      /* points the columns hold */
    int held;             /* how many of the buffers above are held */
} Writer;

static void writer_release(Writer *self) {
    Py_buffer *views[] = {&self->t, &self->v, &self->a, &self->c};
    for (int k = 0; k < self->held; k++) PyBuffer_Release(views[k]);
    self->held = 0;
}

static void writer_dealloc(Writer *self) {
    writer_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A column: writable, C-contiguous, one dimension, items of `itemsize` bytes whose struct format
 * is one of `formats` (numpy gives "l" or "q" for int64, depending on the platform). */
static int column(PyObject *obj, Py_buffer *view, const char *name, Py_ssize_t itemsize,
                  const char *formats) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    if (view->ndim != 1 || view->itemsize != itemsize || strlen(f) != 1 || !strchr(formats, f[0])) {
        PyErr_Format(PyExc_TypeError, "Writer: %s must be a 1-D buffer of %zd-byte items (%s), not "
                     "format %s", name, itemsize, formats, view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int writer_init(Writer *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"t", "v", "a", "c", NULL};
    PyObject *t, *v, *a, *c;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO:Writer", names, &t, &v, &a, &c))
        return -1;
    writer_release(self);  /* __init__ called again */
    self->j = self->size = 0;
    if (column(t, &self->t, "t", 8, "lq") < 0) return -1;
    self->held = 1;
    if (column(v, &self->v, "v", 8, "d") < 0) goto fail;
    self->held = 2;
    if (column(a, &self->a, "a", 2, "H") < 0) goto fail;
    self->held = 3;
    if (column(c, &self->c, "c", 4, "i") < 0) goto fail;
    self->held = 4;
    self->size = self->t.shape[0];
    if (self->v.shape[0] != self->size || self->a.shape[0] != self->size ||
        self->c.shape[0] != self->size) {
        PyErr_SetString(PyExc_ValueError, "Writer: the four columns must be of one length");
        goto fail;
    }
    return 0;
fail:
    writer_release(self);
    return -1;
}

/* An int as a long long. Errors as a Python writer's memoryview gives them: TypeError for what is
 * not an int, ValueError (not OverflowError) for an int out of range. */
static int as_ll(PyObject *obj, long long *out) {
    /* Not PyLong_AsLongLong: on CPython 3.11 it converts any int of more than one 30-bit digit
     * (every time in seconds) through _PyLong_AsByteArray; this one walks the digits. */
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_ValueError, "write: an int out of range");
        return -1;
    }
    if (*out == -1 && PyErr_Occurred())
        return -1;
    return 0;
}

/* write(value, seconds, nanoseconds, severity, status, slot) -> full
 * Everything is checked before anything is written: a point that raises leaves no trace. */
static PyObject *writer_write(Writer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError,
                     "write(value, seconds, nanoseconds, severity, status, slot): "
                     "6 arguments, not %zd", nargs);
        return NULL;
    }
    if (!self->held) {
        PyErr_SetString(PyExc_ValueError, "Writer: not initialised");
        return NULL;
    }
    /* As a "d" memoryview takes it: a float, an int, or anything with __float__ or __index__;
     * TypeError for a string, None or an array, ValueError for an int too large. An int goes
     * straight to a double: PyFloat_AsDouble makes a float object of it first. */
    PyObject *number = args[0];
    double value = PyLong_CheckExact(number) ? PyLong_AsDouble(number) : PyFloat_AsDouble(number);
    if (value == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "write: the value does not fit in a double");
        }
        return NULL;
    }
    long long seconds, nanoseconds, severity, status, slot, t;
    if (as_ll(args[1], &seconds) < 0 || as_ll(args[2], &nanoseconds) < 0 ||
        as_ll(args[3], &severity) < 0 || as_ll(args[4], &status) < 0 ||
        as_ll(args[5], &slot) < 0)
        return NULL;
    if (__builtin_mul_overflow(seconds, NS, &t) || __builtin_add_overflow(t, nanoseconds, &t)) {
        PyErr_SetString(PyExc_ValueError, "write: the time does not fit in 64-bit nanoseconds");
        return NULL;
    }
    /* The alarm is severity << 8 | status & 0xFF, as Python computes it (a negative status keeps
     * its low byte): it fits 16 bits only for a severity of 0..255. */
    if (severity < 0 || severity > 0xFF) {
        PyErr_Format(PyExc_ValueError, "write: severity %lld is not 0..255", severity);
        return NULL;
    }
    if (slot < INT32_MIN || slot > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "write: slot %lld does not fit in 32 bits", slot);
        return NULL;
    }
    Py_ssize_t j = self->j;
    if (j >= self->size) {
        PyErr_SetString(PyExc_IndexError, "write: the journal is full (flush it first)");
        return NULL;
    }
    ((int64_t *)self->t.buf)[j] = (int64_t)t;
    ((double *)self->v.buf)[j] = value;
    ((uint16_t *)self->a.buf)[j] = (uint16_t)(severity << 8 | (status & 0xFF));
    ((int32_t *)self->c.buf)[j] = (int32_t)slot;
    self->j = ++j;
    return PyBool_FromLong(j == self->size);
}

static PyObject *writer_get_j(Writer *self, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(self->j);
}

static int writer_set_j(Writer *self, PyObject *value, void *closure) {
    (void)closure;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "j cannot be deleted");
        return -1;
    }
    Py_ssize_t j = PyLong_AsSsize_t(value);
    if (j == -1 && PyErr_Occurred()) return -1;
    if (j < 0 || j > self->size) {
        PyErr_Format(PyExc_ValueError, "j must be 0..%zd, not %zd", self->size, j);
        return -1;
    }
    self->j = j;
    return 0;
}

static PyObject *writer_get_size(Writer *self, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(self->size);
}

static PyMethodDef writer_methods[] = {
    {"write", (PyCFunction)(void (*)(void))writer_write, METH_FASTCALL,
     "write(value, seconds, nanoseconds, severity, status, slot) -> bool: one point at j; "
     "True when the columns are full after it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef writer_getset[] = {
    {"j", (getter)writer_get_j, (setter)writer_set_j, "Where the next point goes.", NULL},
    {"size", (getter)writer_get_size, NULL, "Points the columns hold.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pvwire.core._journal.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Writer(t, v, a, c): points into four columns (int64 ns, float64, uint16 alarm, "
              "int32 slot).",
    .tp_methods = writer_methods,
    .tp_getset = writer_getset,
    .tp_init = (initproc)writer_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pvwire.core._journal",
    "The history journal's writer (core/history.py), compiled.", -1, NULL, NULL, NULL, NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__journal(void) {
    if (PyType_Ready(&WriterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    Py_INCREF(&WriterType);
    if (PyModule_AddObject(m, "Writer", (PyObject *)&WriterType) < 0) {
        Py_DECREF(&WriterType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
