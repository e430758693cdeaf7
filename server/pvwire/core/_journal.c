/* The history journal's compiled parts for pvwire (core/history/, core/channel.py):
 *
 * - `Writer`: one update of a recorded channel into the journal's four columns, a third of what
 *   the four item writes from Python cost.
 * - `Pending`: at the tick, the one update each dirty channel still holds unwritten
 *   (`Channel.on_update` leaves it there: core/channel.py says why) into its writer, reading
 *   the channel's slots where CPython keeps them, with no Python call per channel.
 * - `Rings`: the journal's flush, every point into its channel's ring and each ring's index
 *   moved on, in one call instead of ~10 numpy calls over the points and a Python call per
 *   channel; `fold`: a ring's waiting points into the finest tier's buckets in one pass
 *   instead of ~15 numpy calls: together a point costs a quarter of what it does in numpy
 *   (bench/JOURNAL.md, "History as a package").
 *
 * Where this module is not built, history/fallback.py and channel.py do the same in Python and
 * numpy (`PyWriter`, `flush`, `fold`, `Channel.write_pending`); tests/test_journal.py runs the
 * same cases through both.
 *
 * `Pending` and `Rings` read and write slots of exactly the class they were made for, at the
 * offsets its member descriptors give, and keep a reference to that class; the names they read
 * are exported (`PENDING_SLOTS`, `RING_SLOTS`) for core/channel.py and core/history/ to check
 * their declarations against at import. A `Writer` keeps its four buffers, released with it.
 * Every call runs with the GIL held, on whichever thread calls it.
 */

#include "_slots.h"
#include <stdint.h>
#include <math.h>
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

/* A C-contiguous buffer of `ndim` dimensions (1: a column; 2: rows of `width` items), writable
 * if `writable`, items of `itemsize` bytes whose struct format is one of `formats` (numpy gives
 * "l" or "q" for int64, depending on the platform). `who` and `name` say whose and which in the
 * TypeError. */
static int buffer_of(PyObject *obj, Py_buffer *view, const char *who, const char *name,
                     Py_ssize_t itemsize, const char *formats, int writable, int ndim,
                     Py_ssize_t width) {
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    const char *f = view->format ? view->format : "B";
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    if (view->ndim != ndim || (ndim == 2 && view->shape[1] != width) ||
        view->itemsize != itemsize || strlen(f) != 1 || !strchr(formats, f[0])) {
        const char *got = view->format ? view->format : "B";
        if (ndim == 1)
            PyErr_Format(PyExc_TypeError, "%s: %s must be a 1-D buffer of %zd-byte items (%s), "
                         "not format %s", who, name, itemsize, formats, got);
        else
            PyErr_Format(PyExc_TypeError, "%s: %s must be 2-D rows of %zd %zd-byte items (%s)",
                         who, name, width, itemsize, formats);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int column(PyObject *obj, Py_buffer *view, const char *who, const char *name,
                  Py_ssize_t itemsize, const char *formats, int writable) {
    return buffer_of(obj, view, who, name, itemsize, formats, writable, 1, 0);
}

static int writer_init(Writer *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"t", "v", "a", "c", NULL};
    PyObject *t, *v, *a, *c;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO:Writer", names, &t, &v, &a, &c))
        return -1;
    writer_release(self);  /* __init__ called again */
    self->j = self->size = 0;
    if (column(t, &self->t, "Writer", "t", 8, "lq", 1) < 0) return -1;
    self->held = 1;
    if (column(v, &self->v, "Writer", "v", 8, "d", 1) < 0) goto fail;
    self->held = 2;
    if (column(a, &self->a, "Writer", "a", 2, "H", 1) < 0) goto fail;
    self->held = 3;
    if (column(c, &self->c, "Writer", "c", 4, "i", 1) < 0) goto fail;
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

/* --- Pending and Rings: bound to a Python class, whose slots they read and write ----------- */

/* What both begin with: the class (a strong reference). An instance of exactly `cls` holds each
 * slot at the offset its member descriptor gives (`slot_offsets`). */
#define BOUND_HEAD PyObject_HEAD PyTypeObject *cls;
typedef struct { BOUND_HEAD } Bound;

static void bound_dealloc(PyObject *self) {
    Py_CLEAR(((Bound *)self)->cls);
    Py_TYPE(self)->tp_free(self);
}

/* 0 if made with its class; -1 and a ValueError if not (__init__ not called, or failed). */
static int bound_ready(PyObject *self, const char *who) {
    if (((Bound *)self)->cls) return 0;
    PyErr_Format(PyExc_ValueError, "%s: not initialised", who);
    return -1;
}

/* --- Pending: the tick's writes ------------------------------------------------------------ */

/* The Channel slots the tick reads, in the order of `args` to `put` from VALUE on. */
static const char *const SLOT_NAMES[] = {
    "history_pending", "history_kind", "history_write", "value",
    "seconds", "nanoseconds", "severity", "status", "history_slot",
};
enum { PENDING, KIND, WRITE, VALUE, SECONDS, NANOSECONDS, SEVERITY, STATUS, SLOT, N_SLOTS };

typedef struct {
    BOUND_HEAD                  /* Channel */
    Py_ssize_t offset[N_SLOTS]; /* where each slot lies in an instance of exactly `cls` */
} Pending;

/* Pending(cls): each name of SLOT_NAMES must be a writable object slot that `cls` itself
 * declares in __slots__ (a member descriptor), so an instance of exactly `cls` holds it at the
 * descriptor's offset. */
static int pending_init(Pending *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"cls", NULL};
    PyObject *cls;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!:Pending", names, &PyType_Type, &cls))
        return -1;
    if (slot_offsets(cls, SLOT_NAMES, N_SLOTS, self->offset, "Pending") < 0) return -1;
    Py_XSETREF(self->cls, (PyTypeObject *)Py_NewRef(cls));
    return 0;
}

/* One channel's pending update into the compiled writer its `history_write` is bound to: that
 * writer (a new reference) when written, NULL when left to Python (not written, nothing
 * changed, no error set). */
static Writer *pending_one(Pending *self, PyObject *ch) {
    PyObject *write = SLOT(ch, self->offset[WRITE]), *value = SLOT(ch, self->offset[VALUE]);
    if (!write || !value || (PyObject *)Py_TYPE(value) != SLOT(ch, self->offset[KIND]) ||
        !PyCFunction_Check(write) ||
        ((PyCFunctionObject *)write)->m_ml->ml_meth != (PyCFunction)(void (*)(void))writer_write)
        return NULL;
    Writer *w = (Writer *)PyCFunction_GET_SELF(write);
    PyObject *held[6] = {value};
    for (int k = SECONDS; k < N_SLOTS; k++)
        if (!(held[k - VALUE] = SLOT(ch, self->offset[k]))) return NULL;
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
    Py_SETREF(SLOT(ch, self->offset[PENDING]), Py_NewRef(Py_False));
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
    if (bound_ready((PyObject *)self, "Pending") < 0) return NULL;
    PyObject *channels = args[0];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0) i = 0;
    for (; i < PyList_GET_SIZE(channels); i++) {
        PyObject *ch = PyList_GET_ITEM(channels, i);
        if (Py_TYPE(ch) != self->cls) return PyLong_FromSsize_t(i);
        if (SLOT(ch, self->offset[PENDING]) != Py_True) continue;  /* also NULL: nothing pending */
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
    .tp_dealloc = bound_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Pending(cls): writes the pending updates of instances of cls (Channel) into "
              "their journals' writers.",
    .tp_methods = pending_methods,
    .tp_init = (initproc)pending_init,
    .tp_new = PyType_GenericNew,
};

/* --- Rings: the journal's flush, compiled --------------------------------------------------- */

/* The ChannelHistory slots the flush reads and moves on. */
static const char *const RING_SLOTS[] = {"i", "folded", "wrapped"};
enum { RING_I, RING_FOLDED, RING_WRAPPED, N_RING_SLOTS };

typedef struct {
    BOUND_HEAD                       /* ChannelHistory */
    Py_ssize_t offset[N_RING_SLOTS]; /* where each slot lies in an instance of exactly `cls` */
    long long size;                  /* RAW_POINTS */
    long long every;                 /* AGGREGATE_EVERY */
} Rings;

static int rings_init(Rings *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"cls", "size", "every", NULL};
    PyObject *cls;
    long long size, every;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!LL:Rings", names, &PyType_Type, &cls,
                                     &size, &every))
        return -1;
    if (size <= 0 || every <= 0 || every > size) {
        PyErr_SetString(PyExc_ValueError, "Rings: needs 0 < every <= size");
        return -1;
    }
    if (slot_offsets(cls, RING_SLOTS, N_RING_SLOTS, self->offset, "Rings") < 0) return -1;
    self->size = size;
    self->every = every;
    Py_XSETREF(self->cls, (PyTypeObject *)Py_NewRef(cls));
    return 0;
}

/* A history of exactly `cls`, or None; anything else is a TypeError. */
static int ring_of(Rings *self, PyObject *h) {
    if (h == Py_None) return 0;
    if (Py_TYPE(h) == self->cls) return 1;
    PyErr_Format(PyExc_TypeError, "Rings: %s is not a %s", Py_TYPE(h)->tp_name,
                 self->cls->tp_name);
    return -1;
}

/* A slot's int, 0 <= value < size (the ring's index and its folded mark). */
static int ring_index(Rings *self, PyObject *h, int k, long long *out) {
    PyObject *obj = SLOT(h, self->offset[k]);
    if (!obj) {
        PyErr_Format(PyExc_AttributeError, "Rings: %s unset", RING_SLOTS[k]);
        return -1;
    }
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (*out == -1 && PyErr_Occurred()) return -1;
    if (overflow || *out < 0 || *out >= self->size) {
        PyErr_Format(PyExc_ValueError, "Rings: %s out of the ring", RING_SLOTS[k]);
        return -1;
    }
    return 0;
}

/* flush(t, v, a, c, n, raw_t, raw_v, raw_a, by_slot) -> list | None
 * The journal's n points (columns t, v, a and c: the slot) into the rows of their slots' rings
 * (raw_*: one row per slot), each at its history's index on, in order; each history's index
 * moved on as ChannelHistory.advance does. Answers the histories whose waiting points should
 * now be folded, or None, having written nothing, when a slot has more than `every` points (a
 * burst: those must be folded between chunks, which the caller does). The points of a slot with
 * no history (None) are not written. Everything is checked before anything is written. */
static PyObject *rings_flush(Rings *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PyList_Check(args[8])) {
        PyErr_SetString(PyExc_TypeError,
                        "flush(t, v, a, c, n, raw_t, raw_v, raw_a, by_slot: list)");
        return NULL;
    }
    if (bound_ready((PyObject *)self, "Rings") < 0) return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(args[4]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    PyObject *by_slot = args[8];
    Py_buffer col[4], raw[3];
    int held_cols = 0, held_raw = 0;
    PyObject *due = NULL, *out = NULL;
    Py_ssize_t *count = NULL, *pos = NULL, *touched = NULL;
    static const char *const COLS[] = {"t", "v", "a", "c"};
    static const Py_ssize_t COL_SIZE[] = {8, 8, 2, 4};
    static const char *const COL_FORMATS[] = {"lq", "d", "H", "i"};
    for (; held_cols < 4; held_cols++)
        if (column(args[held_cols], &col[held_cols], "Rings", COLS[held_cols],
                   COL_SIZE[held_cols], COL_FORMATS[held_cols], 0) < 0)
            goto done;
    static const char *const RAW[] = {"raw_t", "raw_v", "raw_a"};
    for (; held_raw < 3; held_raw++)
        if (buffer_of(args[5 + held_raw], &raw[held_raw], "Rings", RAW[held_raw],
                      COL_SIZE[held_raw], COL_FORMATS[held_raw], 1, 2, self->size) < 0)
            goto done;
    Py_ssize_t slots = PyList_GET_SIZE(by_slot);
    for (int k = 0; k < 4; k++)
        if (n < 0 || col[k].shape[0] < n) {
            PyErr_Format(PyExc_ValueError, "Rings: n must be 0..%zd", col[k].shape[0]);
            goto done;
        }
    for (int k = 0; k < 3; k++)
        if (raw[k].shape[0] != slots) {
            PyErr_SetString(PyExc_ValueError, "Rings: one row per slot of by_slot is needed");
            goto done;
        }
    /* Made first: making it may collect garbage, which may run Python code. */
    due = PyList_New(0);
    size_t per_slot = (size_t)(slots > 0 ? slots : 1);
    size_t most_touched = (size_t)(n < slots ? (n > 0 ? n : 1) : per_slot);
    count = PyMem_Calloc(per_slot, sizeof(Py_ssize_t));
    pos = PyMem_Malloc(per_slot * sizeof(Py_ssize_t));
    touched = PyMem_Malloc(most_touched * sizeof(Py_ssize_t));
    if (!due || !count || !pos || !touched) {
        if (due) PyErr_NoMemory();
        goto done;
    }
    const int32_t *c = col[3].buf;
    Py_ssize_t ntouched = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        int32_t slot = c[j];
        if (slot < 0 || slot >= slots) {
            PyErr_Format(PyExc_ValueError, "Rings: slot %d out of 0..%zd", (int)slot, slots - 1);
            goto done;
        }
        if (count[slot]++ == 0) touched[ntouched++] = slot;
    }
    for (Py_ssize_t m = 0; m < ntouched; m++)
        if (count[touched[m]] > self->every) {
            out = Py_NewRef(Py_None);  /* a burst: the caller's path, nothing written here */
            goto done;
        }
    for (Py_ssize_t m = 0; m < ntouched; m++) {
        Py_ssize_t slot = touched[m];
        PyObject *h = PyList_GET_ITEM(by_slot, slot);
        int is = ring_of(self, h);
        long long i = -1, folded;
        if (is < 0 || (is && (ring_index(self, h, RING_I, &i) < 0 ||
                              ring_index(self, h, RING_FOLDED, &folded) < 0)))
            goto done;
        pos[slot] = i;  /* -1: no history, its points are not written */
    }
    /* Nothing below runs Python code (ints and a list append allocate no tracked object), and
     * by_slot is not changed, so what was checked holds. */
    const int64_t *t = col[0].buf;
    const double *v = col[1].buf;
    const uint16_t *a = col[2].buf;
    int64_t *rt = raw[0].buf;
    double *rv = raw[1].buf;
    uint16_t *ra = raw[2].buf;
    long long size = self->size;
    for (Py_ssize_t j = 0; j < n; j++) {
        int32_t slot = c[j];
        if (pos[slot] < 0) continue;
        Py_ssize_t at = (Py_ssize_t)slot * size + pos[slot]++ % size;
        rt[at] = t[j];
        rv[at] = v[j];
        ra[at] = a[j];
    }
    for (Py_ssize_t m = 0; m < ntouched; m++) {
        Py_ssize_t slot = touched[m];
        if (pos[slot] < 0) continue;
        PyObject *h = PyList_GET_ITEM(by_slot, slot);
        long long i = pos[slot], folded;
        if (ring_index(self, h, RING_FOLDED, &folded) < 0) goto done;
        if (i >= size) {
            i -= size;
            Py_SETREF(SLOT(h, self->offset[RING_WRAPPED]), Py_NewRef(Py_True));
        }
        PyObject *index = PyLong_FromLongLong(i);
        if (!index) goto done;
        Py_SETREF(SLOT(h, self->offset[RING_I]), index);
        long long waiting = i >= folded ? i - folded : i + size - folded;
        if (waiting >= self->every && PyList_Append(due, h) < 0) goto done;
    }
    out = Py_NewRef(due);
done:
    Py_XDECREF(due);
    PyMem_Free(count);
    PyMem_Free(pos);
    PyMem_Free(touched);
    for (int k = 0; k < held_cols; k++) PyBuffer_Release(&col[k]);
    for (int k = 0; k < held_raw; k++) PyBuffer_Release(&raw[k]);
    return out;
}

static PyMethodDef rings_methods[] = {
    {"flush", (PyCFunction)(void (*)(void))rings_flush, METH_FASTCALL,
     "flush(t, v, a, c, n, raw_t, raw_v, raw_a, by_slot) -> list | None: the journal's n "
     "points into their slots' rows, each history's index moved on; the histories due for "
     "folding, or None (nothing written) when a slot has more than `every` points."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RingsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pvwire.core._journal.Rings",
    .tp_basicsize = sizeof(Rings),
    .tp_dealloc = bound_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Rings(cls, size, every): the journal's flush into the rings of instances of cls "
              "(ChannelHistory), which hold `size` points and fold every `every`.",
    .tp_methods = rings_methods,
    .tp_init = (initproc)rings_init,
    .tp_new = PyType_GenericNew,
};

/* --- fold: a ring's waiting points into the finest tier's buckets ---------------------------- */

/* What numpy's add.reduce gives for a contiguous float64 run (its pairwise summation), so that
 * the buckets' sums are the same to the bit as the numpy version's in history/fallback.py. */
static double pairwise_sum(const double *a, Py_ssize_t n) {
    if (n < 8) {
        double res = -0.0;
        for (Py_ssize_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        Py_ssize_t i;
        for (int j = 0; j < 8; j++) r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

/* numpy's minimum and maximum: a NaN on either side wins. */
static double nan_min(double x, double y) { return (isnan(x) || x <= y) ? x : y; }
static double nan_max(double x, double y) { return (isnan(x) || x >= y) ? x : y; }

/* fold(t, v, a, start, k, width) -> [(t0, min, max, sum, last, count, severity), ...]
 * The k points of a ring (columns t: int64 ns, v: float64, a: uint16 alarm) from `start` on,
 * across the ring's end, as buckets of `width` ns: one per run of points with the same
 * t // width (floored), in order; each its start, min, max and sum of the values (numpy's, NaN
 * included), last value, count and highest severity (a >> 8). As `ChannelHistory._aggregate`
 * computes them with numpy, in one pass instead of ~15 numpy calls. */
static PyObject *fold(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "fold(t, v, a, start, k, width)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[3]), k = PyLong_AsSsize_t(args[4]);
    long long width = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer tv, vv, av;
    if (column(args[0], &tv, "fold", "t", 8, "lq", 0) < 0) return NULL;
    if (column(args[1], &vv, "fold", "v", 8, "d", 0) < 0) {
        PyBuffer_Release(&tv);
        return NULL;
    }
    if (column(args[2], &av, "fold", "a", 2, "H", 0) < 0) {
        PyBuffer_Release(&tv);
        PyBuffer_Release(&vv);
        return NULL;
    }
    PyObject *out = NULL;
    double *run = NULL;
    Py_ssize_t size = tv.shape[0];
    if (vv.shape[0] != size || av.shape[0] != size) {
        PyErr_SetString(PyExc_ValueError, "fold: the three columns must be of one length");
        goto done;
    }
    if (width <= 0 || start < 0 || start >= size || k < 0 || k > size) {
        PyErr_Format(PyExc_ValueError, "fold: needs width > 0, 0 <= start < %zd, 0 <= k <= %zd",
                     size, size);
        goto done;
    }
    out = PyList_New(0);
    run = PyMem_Malloc(sizeof(double) * (size_t)(k ? k : 1));
    if (!out || !run) {
        if (!run) PyErr_NoMemory();
        Py_CLEAR(out);
        goto done;
    }
    const int64_t *t = tv.buf;
    const double *v = vv.buf;
    const uint16_t *a = av.buf;
    Py_ssize_t m = 0;
    while (m < k) {
        /* One bucket: the run of points from m with the same key. */
        Py_ssize_t j = (start + m) % size;
        long long key = t[j] / width - (t[j] % width != 0 && t[j] < 0);
        double lo = v[j], hi = v[j];
        unsigned sev = a[j] >> 8;
        Py_ssize_t n = 0;
        run[n++] = v[j];
        for (m++; m < k; m++) {
            j = (start + m) % size;
            long long kj = t[j] / width - (t[j] % width != 0 && t[j] < 0);
            if (kj != key) break;
            lo = nan_min(lo, v[j]);
            hi = nan_max(hi, v[j]);
            if ((unsigned)(a[j] >> 8) > sev) sev = a[j] >> 8;
            run[n++] = v[j];
        }
        /* numpy's add.reduceat: the first value, plus the pairwise sum of the rest. */
        double sum = n > 1 ? run[0] + pairwise_sum(run + 1, n - 1) : run[0];
        PyObject *row = Py_BuildValue("(LddddnI)", key * width, lo, hi, sum, run[n - 1], n, sev);
        if (!row || PyList_Append(out, row) < 0) {
            Py_XDECREF(row);
            Py_CLEAR(out);
            goto done;
        }
        Py_DECREF(row);
    }
done:
    PyMem_Free(run);
    PyBuffer_Release(&tv);
    PyBuffer_Release(&vv);
    PyBuffer_Release(&av);
    return out;
}

static PyMethodDef module_methods[] = {
    {"fold", (PyCFunction)(void (*)(void))fold, METH_FASTCALL,
     "fold(t, v, a, start, k, width) -> list of (t0, min, max, sum, last, count, severity): "
     "a ring's k points from start on as buckets of width ns, as numpy computes them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pvwire.core._journal",
    "The history journal's compiled parts (core/history/, core/channel.py).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__journal(void) {
    if (PyType_Ready(&WriterType) < 0 || PyType_Ready(&PendingType) < 0 ||
        PyType_Ready(&RingsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Writer", (PyObject *)&WriterType) < 0 ||
        PyModule_AddObjectRef(m, "Pending", (PyObject *)&PendingType) < 0 ||
        PyModule_AddObjectRef(m, "Rings", (PyObject *)&RingsType) < 0 ||
        add_names(m, "PENDING_SLOTS", SLOT_NAMES, N_SLOTS) < 0 ||
        add_names(m, "RING_SLOTS", RING_SLOTS, N_RING_SLOTS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
