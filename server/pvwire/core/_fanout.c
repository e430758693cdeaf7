/* The tick's fan-out to clients that take one message per channel (pvws; core/fanout.py), where
 * a client costs a splice of shared bytes per tick, not Python per channel.
 *
 * - `collect(attachments, touched, view, fallback)`: the attachments of a view that emitted, as
 *   Ticker._emit hands them out. A client whose class declares a `collected` list slot gets the
 *   attachment's number appended there (and goes into `touched` when it was the first); any
 *   other client is handed it through `fallback(client, att, view)`, whose truth says the same.
 * - `Splicer(record_cls, channel_cls, entry_cls, connected, value_bit)`, `splice(atts, records,
 *   paced, slow) -> (frames, count)`: a tick's messages of one client as WebSocket frames, in
 *   one bytes object. For each att its record (`records[att]`) is checked as pvws/session.py
 *   does before the plain value (shown, same metadata and severity as last sent, connected, no
 *   fault, a value; not an image when `paced`), and the shared frame of its channel's current
 *   value (the record's `entry`, made once per tick by the first client that needed it) is
 *   copied. Anything else (a record or channel of another class, metadata or severity changed,
 *   a frame not made yet) is `slow(att)`: None (nothing to send), bytes (one frame) or str (one
 *   message, framed here). tests/test_fanout_compiled.py runs the same ticks through both.
 *
 * Every call runs with the GIL held.
 */

#include "_slots.h"
#include <stdint.h>
#include <string.h>

static const char *const RECORD_SLOTS[] = {"ch", "entry", "image", "shown", "meta", "level"};
enum { R_CH, R_ENTRY, R_IMAGE, R_SHOWN, R_META, R_LEVEL, N_RECORD_SLOTS };

static const char *const CHANNEL_SLOTS[] = {"meta",  "severity", "state",
                                            "fault", "known",    "updates"};
enum { C_META, C_SEVERITY, C_STATE, C_FAULT, C_KNOWN, C_UPDATES, N_CHANNEL_SLOTS };

static const char *const ENTRY_SLOTS[] = {"plain_updates", "plain_meta", "plain_frame"};
enum { E_UPDATES, E_META, E_FRAME, N_ENTRY_SLOTS };

/* --- collect --------------------------------------------------------------------------------- */

/* Client classes seen, with where their `collected` slot lies (-1: they have none). A few
 * classes ever (the two endpoints' sessions, an MJPEG feed, test doubles): past CACHED, the
 * offset is looked up each time. */
#define CACHED 8
static PyTypeObject *seen_types[CACHED];
static Py_ssize_t seen_offsets[CACHED];
static int n_seen;
static PyObject *collected_name;

/* Where `type` declares `collected` as a writable object slot of its own, or -1. */
static Py_ssize_t lookup_offset(PyTypeObject *type) {
    PyObject *d = PyDict_GetItemWithError(type->tp_dict, collected_name);
    if (!d) {
        PyErr_Clear();
        return -1;
    }
    if (!Py_IS_TYPE(d, &PyMemberDescr_Type) || PyDescr_TYPE(d) != type) return -1;
    PyMemberDef *member = ((PyMemberDescrObject *)d)->d_member;
    if (member->type != T_OBJECT_EX || (member->flags & READONLY)) return -1;
    return member->offset;
}

static Py_ssize_t collected_offset(PyTypeObject *type) {
    for (int k = 0; k < n_seen; k++)
        if (seen_types[k] == type) return seen_offsets[k];
    Py_ssize_t offset = lookup_offset(type);
    if (n_seen < CACHED) {
        Py_INCREF(type); /* kept for the process's life: the cache names it */
        seen_types[n_seen] = type;
        seen_offsets[n_seen++] = offset;
    }
    return offset;
}

static PyObject *fanout_collect(PyObject *Py_UNUSED(module), PyObject *const *args,
                                Py_ssize_t nargs) {
    if (nargs != 4 || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "collect(attachments: dict, touched: list, view, fallback)");
        return NULL;
    }
    PyObject *attachments = args[0], *touched = args[1], *view = args[2], *fallback = args[3];
    Py_INCREF(attachments);
    Py_ssize_t pos = 0, size = PyDict_GET_SIZE(attachments);
    PyObject *key;
    int rc = 0;
    while (rc == 0 && PyDict_Next(attachments, &pos, &key, NULL)) {
        if (!PyTuple_CheckExact(key) || PyTuple_GET_SIZE(key) != 2) {
            PyErr_SetString(PyExc_TypeError, "collect: attachments are (client, att) pairs");
            rc = -1;
            break;
        }
        PyObject *client = PyTuple_GET_ITEM(key, 0), *att = PyTuple_GET_ITEM(key, 1);
        Py_ssize_t offset = collected_offset(Py_TYPE(client));
        PyObject *list = offset >= 0 ? SLOT(client, offset) : NULL;
        if (list && PyList_CheckExact(list)) {
            if (PyList_GET_SIZE(list) == 0) rc = PyList_Append(touched, client);
            if (rc == 0) rc = PyList_Append(list, att);
            continue;
        }
        Py_INCREF(key); /* held across the call, which runs Python code */
        PyObject *r = PyObject_CallFunctionObjArgs(fallback, client, att, view, NULL);
        int first = r ? PyObject_IsTrue(r) : -1;
        Py_XDECREF(r);
        rc = first < 0 ? -1 : first ? PyList_Append(touched, client) : 0;
        Py_DECREF(key);
        if (rc == 0 && PyDict_GET_SIZE(attachments) != size) {
            PyErr_SetString(PyExc_RuntimeError, "collect: a view's attachments changed");
            rc = -1;
        }
    }
    Py_DECREF(attachments);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* --- splice ---------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyTypeObject *record_cls, *channel_cls, *entry_cls;
    Py_ssize_t r[N_RECORD_SLOTS], c[N_CHANNEL_SLOTS], e[N_ENTRY_SLOTS];
    PyObject *connected; /* the channel state that is connected (ConnState.CONNECTED) */
    long value_bit;      /* `known`'s bit for a value (model.VALUE) */
    char *buf;           /* the frames being spliced, kept between calls */
    Py_ssize_t cap;
} Splicer;

static void splicer_dealloc(Splicer *self) {
    Py_CLEAR(self->record_cls);
    Py_CLEAR(self->channel_cls);
    Py_CLEAR(self->entry_cls);
    Py_CLEAR(self->connected);
    PyMem_Free(self->buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Splicer(record_cls, channel_cls, entry_cls, connected, value_bit) */
static int splicer_init(Splicer *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"record_cls", "channel_cls", "entry_cls", "connected", "value_bit",
                            NULL};
    PyObject *r, *c, *e, *connected;
    long value_bit;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!Ol:Splicer", names, &PyType_Type, &r,
                                     &PyType_Type, &c, &PyType_Type, &e, &connected,
                                     &value_bit))
        return -1;
    if (slot_offsets(r, RECORD_SLOTS, N_RECORD_SLOTS, self->r, "Splicer") < 0 ||
        slot_offsets(c, CHANNEL_SLOTS, N_CHANNEL_SLOTS, self->c, "Splicer") < 0 ||
        slot_offsets(e, ENTRY_SLOTS, N_ENTRY_SLOTS, self->e, "Splicer") < 0)
        return -1;
    Py_XSETREF(self->record_cls, (PyTypeObject *)Py_NewRef(r));
    Py_XSETREF(self->channel_cls, (PyTypeObject *)Py_NewRef(c));
    Py_XSETREF(self->entry_cls, (PyTypeObject *)Py_NewRef(e));
    Py_XSETREF(self->connected, Py_NewRef(connected));
    self->value_bit = value_bit;
    return 0;
}

/* Two ints (or int subclasses: a severity may be an IntEnum) that are equal; 0 for anything
 * else, which then goes the slow way. */
static int same_int(PyObject *a, PyObject *b) {
    if (a == b) return a != NULL;
    if (!a || !b || !PyLong_Check(a) || !PyLong_Check(b)) return 0;
    int oa, ob;
    long x = PyLong_AsLongAndOverflow(a, &oa), y = PyLong_AsLongAndOverflow(b, &ob);
    return !oa && !ob && x == y;
}

/* The shared frame of `record`'s plain value, borrowed, when pvws/session.py would send it; NULL
 * (no error) when it would not, or when the frame is not made yet. */
static PyObject *plain_frame(const Splicer *s, PyObject *record, int paced) {
    if (!Py_IS_TYPE(record, s->record_cls) || SLOT(record, s->r[R_SHOWN]) != Py_True) return NULL;
    if (paced && SLOT(record, s->r[R_IMAGE]) != Py_False) return NULL;
    PyObject *ch = SLOT(record, s->r[R_CH]);
    if (!ch || !Py_IS_TYPE(ch, s->channel_cls)) return NULL;
    PyObject *meta = SLOT(ch, s->c[C_META]);
    if (!meta || meta != SLOT(record, s->r[R_META])) return NULL;
    if (!same_int(SLOT(ch, s->c[C_SEVERITY]), SLOT(record, s->r[R_LEVEL]))) return NULL;
    if (SLOT(ch, s->c[C_STATE]) != s->connected) return NULL;
    PyObject *fault = SLOT(ch, s->c[C_FAULT]);
    if (!fault || !PyUnicode_CheckExact(fault) || PyUnicode_GET_LENGTH(fault) != 0) return NULL;
    PyObject *known = SLOT(ch, s->c[C_KNOWN]);
    int overflow;
    if (!known || !PyLong_CheckExact(known) ||
        !(PyLong_AsLongAndOverflow(known, &overflow) & s->value_bit) || overflow)
        return NULL;
    PyObject *entry = SLOT(record, s->r[R_ENTRY]);
    if (!entry || !Py_IS_TYPE(entry, s->entry_cls) || SLOT(entry, s->e[E_META]) != meta)
        return NULL;
    if (!same_int(SLOT(entry, s->e[E_UPDATES]), SLOT(ch, s->c[C_UPDATES]))) return NULL;
    PyObject *frame = SLOT(entry, s->e[E_FRAME]);
    return frame && PyBytes_CheckExact(frame) ? frame : NULL;
}

/* Room for `more` bytes after `used`; -1 and MemoryError if there is none. */
static int reserve(Splicer *s, Py_ssize_t used, Py_ssize_t more) {
    if (more > PY_SSIZE_T_MAX - used) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t need = used + more;
    if (need <= s->cap) return 0;
    Py_ssize_t cap = s->cap ? s->cap : 64 * 1024;
    while (cap < need) cap = cap > PY_SSIZE_T_MAX / 2 ? need : 2 * cap;
    char *grown = PyMem_Realloc(s->buf, (size_t)cap);
    if (!grown) {
        PyErr_NoMemory();
        return -1;
    }
    s->buf = grown;
    s->cap = cap;
    return 0;
}

/* A text frame's header (RFC 6455 section 5.2: FIN, opcode 1, unmasked) for `n` bytes, as
 * pvws/frames.py's text_frames writes it; its length. */
static int text_header(unsigned char *p, uint64_t n) {
    p[0] = 0x81;
    if (n < 126) {
        p[1] = (unsigned char)n;
        return 2;
    }
    if (n < 65536) {
        p[1] = 126;
        p[2] = (unsigned char)(n >> 8);
        p[3] = (unsigned char)n;
        return 4;
    }
    p[1] = 127;
    for (int k = 0; k < 8; k++) p[2 + k] = (unsigned char)(n >> (56 - 8 * k));
    return 10;
}

static PyObject *splicer_splice(Splicer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!self->record_cls) {
        PyErr_SetString(PyExc_ValueError, "Splicer: not initialised");
        return NULL;
    }
    if (nargs != 4 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "splice(atts: list, records: dict, paced, slow)");
        return NULL;
    }
    PyObject *atts = args[0], *records = args[1], *slow = args[3];
    int paced = PyObject_IsTrue(args[2]);
    if (paced < 0) return NULL;
    Py_INCREF(atts);
    Py_INCREF(records);
    Py_ssize_t used = 0, count = 0;
    int rc = 0;
    /* `slow` runs Python code, which may change either container: read their sizes anew. */
    for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(atts); i++) {
        PyObject *att = Py_NewRef(PyList_GET_ITEM(atts, i));
        PyObject *record = PyDict_GetItemWithError(records, att);
        if (!record) {
            rc = PyErr_Occurred() ? -1 : 0; /* gone since: nothing to send */
            Py_DECREF(att);
            continue;
        }
        PyObject *frame = plain_frame(self, record, paced);
        if (frame) {
            Py_ssize_t n = PyBytes_GET_SIZE(frame);
            rc = reserve(self, used, n);
            if (rc == 0) {
                memcpy(self->buf + used, PyBytes_AS_STRING(frame), (size_t)n);
                used += n;
                count++;
            }
            Py_DECREF(att);
            continue;
        }
        PyObject *r = PyObject_CallOneArg(slow, att);
        Py_DECREF(att);
        if (!r) {
            rc = -1;
        } else if (PyBytes_CheckExact(r)) {
            Py_ssize_t n = PyBytes_GET_SIZE(r);
            rc = reserve(self, used, n);
            if (rc == 0) {
                memcpy(self->buf + used, PyBytes_AS_STRING(r), (size_t)n);
                used += n;
                count++;
            }
        } else if (PyUnicode_CheckExact(r)) {
            Py_ssize_t n;
            const char *text = PyUnicode_AsUTF8AndSize(r, &n);
            rc = text ? reserve(self, used, n + 10) : -1;
            if (rc == 0) {
                used += text_header((unsigned char *)self->buf + used, (uint64_t)n);
                memcpy(self->buf + used, text, (size_t)n);
                used += n;
                count++;
            }
        } else if (r != Py_None) {
            PyErr_Format(PyExc_TypeError, "splice: slow() gave a %s, not bytes, str or None",
                         Py_TYPE(r)->tp_name);
            rc = -1;
        }
        Py_XDECREF(r);
    }
    Py_DECREF(atts);
    Py_DECREF(records);
    if (rc < 0) return NULL;
    PyObject *data = PyBytes_FromStringAndSize(self->buf, used);
    if (!data) return NULL;
    PyObject *out = Py_BuildValue("(Nn)", data, count);
    if (self->cap > 4 * 1024 * 1024) { /* a tick of images: not kept for the next */
        PyMem_Free(self->buf);
        self->buf = NULL;
        self->cap = 0;
    }
    return out;
}

static PyMethodDef splicer_methods[] = {
    {"splice", (PyCFunction)(void (*)(void))splicer_splice, METH_FASTCALL,
     "splice(atts, records, paced, slow) -> (frames, count): one client's messages of a tick."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SplicerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pvwire.core._fanout.Splicer",
    .tp_basicsize = sizeof(Splicer),
    .tp_dealloc = (destructor)splicer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Splicer(record_cls, channel_cls, entry_cls, connected, value_bit): splices one "
              "client's shared frames per tick, reading instances of exactly these classes.",
    .tp_methods = splicer_methods,
    .tp_init = (initproc)splicer_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef module_methods[] = {
    {"collect", (PyCFunction)(void (*)(void))fanout_collect, METH_FASTCALL,
     "collect(attachments, touched, view, fallback): a view's attachments to their clients."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pvwire.core._fanout",
    "The tick's fan-out to clients of one message per channel (core/fanout.py).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fanout(void) {
    if (PyType_Ready(&SplicerType) < 0) return NULL;
    if (!collected_name && !(collected_name = PyUnicode_InternFromString("collected")))
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Splicer", (PyObject *)&SplicerType) < 0 ||
        add_names(m, "RECORD_SLOTS", RECORD_SLOTS, N_RECORD_SLOTS) < 0 ||
        add_names(m, "CHANNEL_SLOTS", CHANNEL_SLOTS, N_CHANNEL_SLOTS) < 0 ||
        add_names(m, "ENTRY_SLOTS", ENTRY_SLOTS, N_ENTRY_SLOTS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
