/* The history journal's writer for pvwire (core/history.py): one update of a recorded channel
 * into four columns, in C.
 *
 * Why compiled: from Python, the four item writes took ~190 ns of `Channel.on_update` in a loop
 * of one channel, this call ~55 ns (recording's whole cost there went from +323 to +182 ns,
 * bench/history.py, 2026-11-25). In a server of 1,000 CA channels, timed around the recording
 * lines on the event loop, recording took ~500 ns per update with the Python writes and ~300 ns
 * with this call (both with the journal's flush, 2026-11-25).
 *
 * `Pending` writes, at the tick, the one update each channel changed since the last tick and
 * still holds unwritten (`Channel.on_update` leaves it there: core/channel.py says why), reading
 * the channel's slots where CPython keeps them, with no Python call per channel.
 *
 * history.py keeps a Python writer with the same behaviour (`PyWriter`) for a checkout where
 * this module is not built; tests/test_journal.py runs the same cases against both. channel.py
 * writes pending updates in Python where `Pending` is not built, or cannot take a channel.
 *
 * Nothing here keeps a reference to a Python object but the four buffers, released with the
 * writer. Every call runs with the GIL held, on whichever thread calls it.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
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

/* One point at j. Everything is converted and checked before anything is written, and the
 * buffers are checked after the conversions (which may run Python code): a point that fails
 * leaves no trace. 0, or -1 with an exception set. */
static int put(Writer *self, PyObject *number, PyObject *const *ints) {
    /* As a "d" memoryview takes it: a float, an int, or anything with __float__ or __index__;
     * TypeError for a string, None or an array, ValueError for an int too large. An int goes
     * straight to a double: PyFloat_AsDouble makes a float object of it first. */
    double value = PyLong_CheckExact(number) ? PyLong_AsDouble(number) : PyFloat_AsDouble(number);
    if (value == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "write: the value does not fit in a double");
        }
        return -1;
    }
    long long seconds, nanoseconds, severity, status, slot, t;
    if (as_ll(ints[0], &seconds) < 0 || as_ll(ints[1], &nanoseconds) < 0 ||
        as_ll(ints[2], &severity) < 0 || as_ll(ints[3], &status) < 0 ||
        as_ll(ints[4], &slot) < 0)
        return -1;
    if (__builtin_mul_overflow(seconds, NS, &t) || __builtin_add_overflow(t, nanoseconds, &t)) {
        PyErr_SetString(PyExc_ValueError, "write: the time does not fit in 64-bit nanoseconds");
        return -1;
    }
    /* The alarm is severity << 8 | status & 0xFF, as Python computes it (a negative status keeps
     * its low byte): it fits 16 bits only for a severity of 0..255. */
    if (severity < 0 || severity > 0xFF) {
        PyErr_Format(PyExc_ValueError, "write: severity %lld is not 0..255", severity);
        return -1;
    }
    if (slot < INT32_MIN || slot > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "write: slot %lld does not fit in 32 bits", slot);
        return -1;
    }
    if (!self->held) {
        PyErr_SetString(PyExc_ValueError, "Writer: not initialised");
        return -1;
    }
    Py_ssize_t j = self->j;
    if (j >= self->size) {
        PyErr_SetString(PyExc_IndexError, "write: the journal is full (flush it first)");
        return -1;
    }
    ((int64_t *)self->t.buf)[j] = (int64_t)t;
    ((double *)self->v.buf)[j] = value;
    ((uint16_t *)self->a.buf)[j] = (uint16_t)(severity << 8 | (status & 0xFF));
    ((int32_t *)self->c.buf)[j] = (int32_t)slot;
    self->j = j + 1;
    return 0;
}

/* write(value, seconds, nanoseconds, severity, status, slot) -> full */
static PyObject *writer_write(Writer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError,
                     "write(value, seconds, nanoseconds, severity, status, slot): "
                     "6 arguments, not %zd", nargs);
        return NULL;
    }
    if (put(self, args[0], args + 1) < 0) return NULL;
    return PyBool_FromLong(self->j == self->size);
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

/* --- Pending: the tick's writes ------------------------------------------------------------ */

/* The Channel slots the tick reads, in the order of `args` to `put` from VALUE on. */
static const char *const SLOT_NAMES[] = {
    "history_pending", "history_kind", "history_write", "value",
    "seconds", "nanoseconds", "severity", "status", "history_slot",
};
enum { PENDING, KIND, WRITE, VALUE, SECONDS, NANOSECONDS, SEVERITY, STATUS, SLOT, N_SLOTS };

typedef struct {
    PyObject_HEAD
    PyTypeObject *cls;          /* the class whose slots these are (a strong reference) */
    Py_ssize_t offset[N_SLOTS]; /* where each slot lies in an instance of exactly `cls` */
} Pending;

static void pending_dealloc(Pending *self) {
    Py_CLEAR(self->cls);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Pending(cls): each name of SLOT_NAMES must be a writable object slot that `cls` itself
 * declares in __slots__ (a member descriptor), so an instance of exactly `cls` holds it at the
 * descriptor's offset. */
static int pending_init(Pending *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"cls", NULL};
    PyObject *cls;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!:Pending", names, &PyType_Type, &cls))
        return -1;
    for (int k = 0; k < N_SLOTS; k++) {
        PyObject *d = PyObject_GetAttrString(cls, SLOT_NAMES[k]);
        if (!d) return -1;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                 PyDescr_TYPE(d) == (PyTypeObject *)cls &&
                 ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX &&
                 !(((PyMemberDescrObject *)d)->d_member->flags & READONLY);
        if (ok) self->offset[k] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "Pending: %s.%s is not a writable slot of its own",
                         ((PyTypeObject *)cls)->tp_name, SLOT_NAMES[k]);
            return -1;
        }
    }
    Py_XSETREF(self->cls, (PyTypeObject *)Py_NewRef(cls));
    return 0;
}

#define SLOT(obj, k) (*(PyObject **)((char *)(obj) + self->offset[k]))

/* One channel's pending update into the compiled writer its `history_write` is bound to: that
 * writer (a new reference) when written, NULL when left to Python (not written, nothing
 * changed, no error set). */
static Writer *pending_one(Pending *self, PyObject *ch) {
    PyObject *write = SLOT(ch, WRITE), *value = SLOT(ch, VALUE);
    if (!write || !value || (PyObject *)Py_TYPE(value) != SLOT(ch, KIND) ||
        !PyCFunction_Check(write) ||
        ((PyCFunctionObject *)write)->m_ml->ml_meth != (PyCFunction)(void (*)(void))writer_write)
        return NULL;
    Writer *w = (Writer *)PyCFunction_GET_SELF(write);
    PyObject *held[6] = {value};
    for (int k = SECONDS; k < N_SLOTS; k++)
        if (!(held[k - VALUE] = SLOT(ch, k))) return NULL;
    /* Held while converting: a conversion may run Python code, which could rebind the slots. */
    Py_INCREF(w);
    for (int k = 0; k < 6; k++) Py_INCREF(held[k]);
    int ok = put(w, held[0], held + 1) == 0;
    for (int k = 0; k < 6; k++) Py_DECREF(held[k]);
    if (!ok) {
        PyErr_Clear();  /* Python writes it again, and its channel's failure path gets the error */
        Py_DECREF(w);
        return NULL;
    }
    Py_SETREF(SLOT(ch, PENDING), Py_NewRef(Py_False));
    return w;
}

/* write(channels: list, start) -> int
 * From channels[start] on, the pending update of each channel of exactly `cls` into its
 * writer. Stops at a channel it leaves to Python, and answers its index i (not written: another
 * class, a Python writer, a value not of `history_kind`, a point refused); after a point that
 * filled its writer, answers -(i + 1) (written; the journal wants its flush); else
 * len(channels). */
static PyObject *pending_write(Pending *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "write(channels: list, start: int)");
        return NULL;
    }
    if (!self->cls) {
        PyErr_SetString(PyExc_ValueError, "Pending: not initialised");
        return NULL;
    }
    PyObject *channels = args[0];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0) i = 0;
    for (; i < PyList_GET_SIZE(channels); i++) {
        PyObject *ch = PyList_GET_ITEM(channels, i);
        if (Py_TYPE(ch) != self->cls) return PyLong_FromSsize_t(i);
        if (SLOT(ch, PENDING) != Py_True) continue;  /* also NULL: nothing pending */
        Py_INCREF(ch);
        Writer *w = pending_one(self, ch);
        Py_DECREF(ch);
        if (!w) return PyLong_FromSsize_t(i);
        int full = w->j == w->size;
        Py_DECREF(w);
        if (full) return PyLong_FromSsize_t(-(i + 1));
    }
    return PyLong_FromSsize_t(PyList_GET_SIZE(channels));
}

#undef SLOT

static PyMethodDef pending_methods[] = {
    {"write", (PyCFunction)(void (*)(void))pending_write, METH_FASTCALL,
     "write(channels, start) -> int: the pending updates of channels[start:] into their "
     "writers; the index of one left to Python, -(index + 1) after one that filled its "
     "writer, or len(channels)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PendingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pvwire.core._journal.Pending",
    .tp_basicsize = sizeof(Pending),
    .tp_dealloc = (destructor)pending_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Pending(cls): writes the pending updates of instances of cls (Channel) into "
              "their journals' writers.",
    .tp_methods = pending_methods,
    .tp_init = (initproc)pending_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pvwire.core._journal",
    "The history journal's writer (core/history.py), compiled.", -1, NULL, NULL, NULL, NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__journal(void) {
    if (PyType_Ready(&WriterType) < 0 || PyType_Ready(&PendingType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Writer", (PyObject *)&WriterType) < 0 ||
        PyModule_AddObjectRef(m, "Pending", (PyObject *)&PendingType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
