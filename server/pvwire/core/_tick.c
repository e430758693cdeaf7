/* The tick's compiled parts for pvwire (core/tick.py, core/view.py): a `Router` bound to the
 * Channel and View classes, whose slots it reads and writes where CPython keeps them.
 *
 * - `route`: the tick's changes into the `pending` masks of the views, as `Ticker._route` and
 *   `View.add_change` do; each LATEST view that holds a changed channel reads its channels'
 *   masks from the tick's table in one pass, with no Python call per channel and view.
 * - `splice`: a view's entries for a dict of masks, as `View.entries_for` makes them: each
 *   channel's shared body found in the tick's table (made by `Channel.body` for the first view
 *   that asks) or its cache, written behind the entry's header and sid, into one bytes object.
 *
 * With distinct screens, both run once per delivered update (500 screens of 200 of 2,000 PVs
 * at 10 Hz: 1,000,000 a second), where the Python loops cost ~0.9 and ~1.4 µs per update, and
 * these 0.12 and 0.16 µs (`python -m bench.tick_route`; bench/JOURNAL.md, "The control room,
 * compiled"). Anything the fast paths do not cover (an ALL-mode view, a view with a reduction,
 * metadata with per-identity `writable`, a channel not changed this tick, another class) goes
 * through the same Python code as without this module; tests/test_tick_compiled.py runs the
 * same ticks through both.
 *
 * The slot names are exported (`CHANNEL_SLOTS`, `VIEW_SLOTS`) for channel.py and view.py to
 * check their declarations against at import. Every call runs with the GIL held.
 */

#include "_slots.h"
#include <stdint.h>
#include <string.h>

static const char *const CHANNEL_SLOTS[] = {"dirty",   "views", "latest_views", "all_views",
                                            "history", "known", "_cache",       "number"};
enum { CH_DIRTY, CH_VIEWS, CH_LATEST, CH_ALL_VIEWS, CH_HISTORY, CH_KNOWN, CH_CACHE, CH_NUMBER,
       N_CHANNEL_SLOTS };

static const char *const VIEW_SLOTS[] = {"pending", "all_mode", "channels",
                                         "numbers", "routed",   "writes"};
enum { V_PENDING, V_ALL_MODE, V_CHANNELS, V_NUMBERS, V_ROUTED, V_WRITES, N_VIEW_SLOTS };

/* This tick's change of one dirty channel: its mask and, once a splice has asked, the body
 * Channel.body gives for it, with that body's fields. Strong references, held from `route` to
 * `forget`. `ch` NULL: no change. */
typedef struct {
    PyObject *ch;
    long mask;
    PyObject *body;
    const char *data; /* the body's bytes, which it holds */
    Py_ssize_t size;
    uint64_t length, array_at;
} Change;

typedef struct {
    PyObject_HEAD
    PyTypeObject *channel_cls, *view_cls;
    Py_ssize_t ch[N_CHANNEL_SLOTS]; /* where each slot lies in an instance of exactly the class */
    Py_ssize_t v[N_VIEW_SLOTS];
    long meta;        /* the META bit: a META mask with `writable` per identity is not cached
                         under the bare mask (Channel.body) */
    PyObject *body;   /* "body", interned */
    /* The tick's changes by channel `number` (each live channel's own small int; a view lists
     * its channels' in `numbers`, int32). Routing and splicing read a view's numbers in order
     * and this one dense table, not each channel object, its cache dict, the body and its
     * bytes object. */
    Change *changes;
    Py_ssize_t cap_changes;
    int32_t *touched; /* the numbers set this tick */
    Py_ssize_t n_touched, cap_touched;
    int exact;        /* every dirty channel is in `changes` under its number: a channel found
                         elsewhere there did not change. Else routing reads each `dirty`. */
} Router;

/* The last tick's changes let go. */
static void forget_changes(Router *self) {
    for (Py_ssize_t i = 0; i < self->n_touched; i++) {
        Change *change = &self->changes[self->touched[i]];
        Py_CLEAR(change->ch);
        Py_CLEAR(change->body);
    }
    self->n_touched = 0;
    self->exact = 1;
}

/* The change of `ch`, listed under `number`, this tick; NULL if none. */
static inline Change *change_of(const Router *self, const PyObject *ch, int32_t number) {
    if (number < 0 || number >= self->cap_changes) return NULL;
    Change *change = &self->changes[number];
    return change->ch == ch ? change : NULL;
}

/* `ch`'s change listed under its number; 0 when it cannot be (a number out of range, or taken
 * this tick by another channel: then the table is not exact), -1 and an error on failure. */
static int list_change(Router *self, PyObject *ch, long mask) {
    PyObject *slot = SLOT(ch, self->ch[CH_NUMBER]);
    long number = slot && PyLong_CheckExact(slot) ? PyLong_AsLong(slot) : -1;
    if (number == -1 && PyErr_Occurred()) return -1;
    if (number < 0 || number > INT32_MAX) {
        self->exact = 0;
        return 0;
    }
    if (number >= self->cap_changes) {
        Py_ssize_t cap = self->cap_changes ? self->cap_changes : 1024;
        while (cap <= number) cap *= 2;
        Change *grown = PyMem_Realloc(self->changes, (size_t)cap * sizeof(Change));
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        memset(grown + self->cap_changes, 0, (size_t)(cap - self->cap_changes) * sizeof(Change));
        self->changes = grown;
        self->cap_changes = cap;
    }
    if (self->n_touched == self->cap_touched) {
        Py_ssize_t cap = self->cap_touched ? 2 * self->cap_touched : 1024;
        int32_t *grown = PyMem_Realloc(self->touched, (size_t)cap * sizeof(int32_t));
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        self->touched = grown;
        self->cap_touched = cap;
    }
    Change *change = &self->changes[number];
    if (change->ch == ch) return 0; /* listed twice: the one change */
    if (change->ch) {
        self->exact = 0;
        return 0;
    }
    *change = (Change){.ch = Py_NewRef(ch), .mask = mask};
    self->touched[self->n_touched++] = (int32_t)number;
    return 0;
}

static void router_dealloc(Router *self) {
    forget_changes(self);
    PyMem_Free(self->changes);
    PyMem_Free(self->touched);
    Py_CLEAR(self->channel_cls);
    Py_CLEAR(self->view_cls);
    Py_CLEAR(self->body);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Router(channel_cls, view_cls, meta) */
static int router_init(Router *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"channel_cls", "view_cls", "meta", NULL};
    PyObject *ch, *v;
    long meta;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!l:Router", names, &PyType_Type, &ch,
                                     &PyType_Type, &v, &meta))
        return -1;
    if (slot_offsets(ch, CHANNEL_SLOTS, N_CHANNEL_SLOTS, self->ch, "Router") < 0 ||
        slot_offsets(v, VIEW_SLOTS, N_VIEW_SLOTS, self->v, "Router") < 0)
        return -1;
    PyObject *body = PyUnicode_InternFromString("body");
    if (!body) return -1;
    Py_XSETREF(self->body, body);
    Py_XSETREF(self->channel_cls, (PyTypeObject *)Py_NewRef(ch));
    Py_XSETREF(self->view_cls, (PyTypeObject *)Py_NewRef(v));
    self->meta = meta;
    self->exact = 1;
    return 0;
}

static int router_ready(Router *self) {
    if (self->channel_cls) return 0;
    PyErr_SetString(PyExc_ValueError, "Router: not initialised");
    return -1;
}

/* --- route ----------------------------------------------------------------------------------- */

/* A slot of an object of exactly `cls`, which must be set and of exactly `type`; NULL and a
 * TypeError if it is not. Borrowed. */
static PyObject *typed_slot(PyObject *obj, Py_ssize_t offset, PyTypeObject *type,
                            const char *what) {
    PyObject *x = SLOT(obj, offset);
    if (x && Py_IS_TYPE(x, type)) return x;
    PyErr_Format(PyExc_TypeError, "route: %s must be a %s", what, type->tp_name);
    return NULL;
}

/* The channel's ALL-mode views: each through add_one(view, sid, mask, channel), whose answer
 * says whether the view goes into `active` (View.add_change's), its (view, sid) then listed in
 * `handed`: an ALL-mode view appends every update it is handed, so after an error Python must
 * know which it need not hand the change again. */
static int route_all_mode(Router *self, PyObject *ch, PyObject *mask, PyObject *active,
                          PyObject *add_one, PyObject *handed) {
    PyObject *views = typed_slot(ch, self->ch[CH_VIEWS], &PyDict_Type, "Channel.views");
    if (!views) return -1;
    Py_INCREF(views);
    Py_ssize_t pos = 0;
    PyObject *key;
    int rc = 0;
    while (rc == 0 && PyDict_Next(views, &pos, &key, NULL)) {
        if (!PyTuple_CheckExact(key) || PyTuple_GET_SIZE(key) != 2) {
            PyErr_SetString(PyExc_TypeError, "route: a channel's views are (view, sid) pairs");
            rc = -1;
            break;
        }
        PyObject *view = PyTuple_GET_ITEM(key, 0), *sid = PyTuple_GET_ITEM(key, 1);
        if (Py_TYPE(view) == self->view_cls && SLOT(view, self->v[V_ALL_MODE]) == Py_False)
            continue; /* a LATEST view: merged by `pull` */
        /* Held across the call: Python code may change the channel's views. */
        Py_INCREF(key);
        PyObject *r = PyObject_CallFunctionObjArgs(add_one, view, sid, mask, ch, NULL);
        int first = r ? PyObject_IsTrue(r) : -1;
        Py_XDECREF(r);
        if (first >= 0) rc = PyList_Append(handed, key);
        if (rc == 0) rc = first < 0 ? -1 : first ? PyDict_SetItem(active, view, Py_None) : 0;
        Py_DECREF(key);
    }
    Py_DECREF(views);
    return rc;
}

/* A view's `numbers` as int32s, one per channel; NULL and a TypeError if they are not. */
static const int32_t *numbers_of(Router *self, PyObject *view, Py_ssize_t n) {
    PyObject *numbers = SLOT(view, self->v[V_NUMBERS]);
    if (numbers && PyBytes_CheckExact(numbers) &&
        PyBytes_GET_SIZE(numbers) == n * (Py_ssize_t)sizeof(int32_t))
        return (const int32_t *)PyBytes_AS_STRING(numbers);
    PyErr_SetString(PyExc_TypeError, "View.numbers must hold an int32 per channel");
    return NULL;
}

/* A channel's mask this tick: from the table, or (when it is not exact) its `dirty`. */
static long mask_of(Router *self, PyObject *ch, int32_t number) {
    Change *change = change_of(self, ch, number);
    if (change) return change->mask;
    if (self->exact) return 0;
    if (Py_TYPE(ch) != self->channel_cls) {
        PyErr_SetString(PyExc_TypeError, "route: a view's channels must be Channels");
        return -1;
    }
    PyObject *mask = SLOT(ch, self->ch[CH_DIRTY]);
    if (!mask || !PyLong_CheckExact(mask)) {
        PyErr_SetString(PyExc_TypeError, "route: Channel.dirty must be an int");
        return -1;
    }
    return PyLong_AsLong(mask);
}

/* One LATEST view that holds a dirty channel: the mask of each of its channels that changed,
 * into `pending`; into `active` if `pending` was empty. One pass over the view's numbers. */
static int pull(Router *self, PyObject *view, PyObject *active) {
    PyObject *channels = typed_slot(view, self->v[V_CHANNELS], &PyList_Type, "View.channels");
    PyObject *pending = typed_slot(view, self->v[V_PENDING], &PyDict_Type, "View.pending");
    if (!channels || !pending) return -1;
    Py_ssize_t n = PyList_GET_SIZE(channels);
    const int32_t *numbers = numbers_of(self, view, n);
    if (!numbers) return -1;
    int first = PyDict_GET_SIZE(pending) == 0;
    Py_INCREF(pending);
    Py_INCREF(channels);
    int rc = 0;
    for (Py_ssize_t sid = 0; rc == 0 && sid < n; sid++) {
        long m = mask_of(self, PyList_GET_ITEM(channels, sid), numbers[sid]);
        if (m == 0) continue;
        if (m == -1 && PyErr_Occurred()) {
            rc = -1;
            break;
        }
        PyObject *key = PyLong_FromSsize_t(sid), *mask = PyLong_FromLong(m);
        if (!key || !mask) {
            Py_XDECREF(key);
            Py_XDECREF(mask);
            rc = -1;
            break;
        }
        PyObject *old = first ? NULL : PyDict_GetItemWithError(pending, key);
        PyObject *merged = old ? PyNumber_Or(old, mask) : PyErr_Occurred() ? NULL : Py_NewRef(mask);
        rc = merged ? PyDict_SetItem(pending, key, merged) : -1;
        Py_XDECREF(merged);
        Py_DECREF(mask);
        Py_DECREF(key);
    }
    if (rc == 0 && first && PyDict_GET_SIZE(pending)) rc = PyDict_SetItem(active, view, Py_None);
    Py_DECREF(channels);
    Py_DECREF(pending);
    return rc;
}

/* route(dirty: list, active: dict, add_one, token, handed: list) -> None
 * The tick's changes into its views, in four passes:
 * 1. each dirty channel (exactly of the Channel class) marks each LATEST view that holds it
 *    (its `latest_views`) with `token`, the first time this tick, and hands its change to each
 *    ALL-mode view (its `views`) through add_one(view, sid, mask, channel), which answers
 *    whether that view goes into `active` (View.add_change's answer), listing each (view, sid)
 *    so handed in `handed`;
 * 2. each change goes into the table under its channel's number;
 * 3. each marked view merges the masks of its changed channels into its `pending` (`pull`):
 *    one pass over its numbers, where pushing each change to each view chased a (view, sid)
 *    pair per delivery;
 * 4. each channel's `dirty` is 0 and its `history` empty.
 * The table is kept for the splices of this tick until `forget`. An error in passes 1-3 leaves
 * every `dirty` set, in pass 4 those not yet cleared, so that Python can route them again:
 * merging a mask twice changes nothing, and the ALL-mode views in `handed` are not handed the
 * change again. */
static PyObject *router_route(Router *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_CheckExact(args[0]) || !PyDict_Check(args[1]) ||
        !PyList_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "route(dirty: list, active: dict, add_one, token, handed: list)");
        return NULL;
    }
    if (router_ready(self) < 0) return NULL;
    PyObject *dirty = args[0], *active = args[1], *add_one = args[2], *token = args[3];
    PyObject *handed = args[4];
    PyObject *marked = PyList_New(0);
    if (!marked) return NULL;
    Py_INCREF(dirty);
    Py_ssize_t i;
    int rc = 0;
    for (i = 0; rc == 0 && i < PyList_GET_SIZE(dirty); i++) {
        PyObject *ch = PyList_GET_ITEM(dirty, i);
        if (Py_TYPE(ch) != self->channel_cls) {
            PyErr_SetString(PyExc_TypeError, "route: a dirty channel must be a Channel");
            rc = -1;
            break;
        }
        PyObject *latest =
            typed_slot(ch, self->ch[CH_LATEST], &PyDict_Type, "Channel.latest_views");
        PyObject *all_views =
            typed_slot(ch, self->ch[CH_ALL_VIEWS], &PyLong_Type, "Channel.all_views");
        PyObject *mask = typed_slot(ch, self->ch[CH_DIRTY], &PyLong_Type, "Channel.dirty");
        if (!latest || !all_views || !mask) {
            rc = -1;
            break;
        }
        Py_ssize_t pos = 0;
        PyObject *view;
        while (PyDict_Next(latest, &pos, &view, NULL)) {
            if (Py_TYPE(view) != self->view_cls) {
                PyErr_SetString(PyExc_TypeError, "route: latest_views must hold Views");
                rc = -1;
                break;
            }
            if (SLOT(view, self->v[V_ROUTED]) == token) continue;
            Py_XSETREF(SLOT(view, self->v[V_ROUTED]), Py_NewRef(token));
            if ((rc = PyList_Append(marked, view)) < 0) break;
        }
        if (rc == 0 && PyObject_IsTrue(all_views)) {
            Py_INCREF(ch);
            Py_INCREF(mask);
            rc = route_all_mode(self, ch, mask, active, add_one, handed);
            Py_DECREF(mask);
            Py_DECREF(ch);
        }
    }
    forget_changes(self);
    Py_ssize_t n = PyList_GET_SIZE(dirty);
    for (i = 0; rc == 0 && i < n; i++) {
        PyObject *ch = PyList_GET_ITEM(dirty, i);
        long mask = PyLong_AsLong(SLOT(ch, self->ch[CH_DIRTY]));
        rc = mask == -1 && PyErr_Occurred() ? -1 : list_change(self, ch, mask);
    }
    for (i = 0; rc == 0 && i < PyList_GET_SIZE(marked); i++)
        rc = pull(self, PyList_GET_ITEM(marked, i), active);
    if (rc == 0) {
        PyObject *zero = PyLong_FromLong(0);
        if (!zero) rc = -1;
        for (i = 0; rc == 0 && i < n; i++) {
            PyObject *ch = PyList_GET_ITEM(dirty, i);
            Py_XSETREF(SLOT(ch, self->ch[CH_DIRTY]), Py_NewRef(zero));
            PyObject *history = SLOT(ch, self->ch[CH_HISTORY]);
            if (history && PyList_CheckExact(history) && PyList_GET_SIZE(history))
                rc = PyList_SetSlice(history, 0, PyList_GET_SIZE(history), NULL);
        }
        Py_XDECREF(zero);
    }
    Py_DECREF(marked);
    Py_DECREF(dirty);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* --- splice ---------------------------------------------------------------------------------- */

/* Bytes of a MessagePack unsigned integer (what msgpack packs a non-negative int as). */
static Py_ssize_t uint_size(uint64_t v) {
    return v < 0x80 ? 1 : v < 0x100 ? 2 : v < 0x10000 ? 3 : v <= 0xffffffffULL ? 5 : 9;
}

static char *put_be(char *p, uint64_t v, int n) {
    for (int k = n - 1; k >= 0; k--) *p++ = (char)(v >> (8 * k));
    return p;
}

static char *put_uint(char *p, uint64_t v) {
    if (v < 0x80) {
        *p++ = (char)v;
        return p;
    }
    if (v < 0x100) return *p++ = (char)0xcc, put_be(p, v, 1);
    if (v < 0x10000) return *p++ = (char)0xcd, put_be(p, v, 2);
    if (v <= 0xffffffffULL) return *p++ = (char)0xce, put_be(p, v, 4);
    return *p++ = (char)0xcf, put_be(p, v, 8);
}

/* Bytes of an array header for n items, as codec.array_header writes it. */
static Py_ssize_t header_size(uint64_t n) { return n < 16 ? 1 : n < 0x10000 ? 3 : 5; }

static char *put_header(char *p, uint64_t n) {
    if (n < 16) {
        *p++ = (char)(0x90 | n);
        return p;
    }
    if (n < 0x10000) return *p++ = (char)0xdc, put_be(p, n, 2);
    return *p++ = (char)0xdd, put_be(p, n, 4);
}

typedef struct {
    uint64_t sid, length, array_at;
    PyObject *data;    /* borrowed from the body, which the splice or the tick's changes hold */
    const char *bytes; /* its contents */
    Py_ssize_t size;
} Part;

/* A body's fields; -1 and a TypeError if it is not an EntryBody (length, data, array_at). */
static int read_body(PyObject *body, Part *part) {
    if (!PyTuple_Check(body) || PyTuple_GET_SIZE(body) != 3 ||
        !PyBytes_CheckExact(PyTuple_GET_ITEM(body, 1))) {
        PyErr_SetString(PyExc_TypeError, "splice: a body must be an EntryBody");
        return -1;
    }
    part->length = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(body, 0));
    if (part->length == (uint64_t)-1 && PyErr_Occurred()) return -1;
    part->array_at = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(body, 2));
    if (part->array_at == (uint64_t)-1 && PyErr_Occurred()) return -1;
    part->data = PyTuple_GET_ITEM(body, 1);
    return 0;
}

/* The body a LATEST view without a reduction sends for `mask` of `ch`, as Channel.body gives
 * it, into `part` (its data held by `*held`, a new reference, or by the tick's changes). */
static int body_for(Router *self, PyObject *ch, int32_t number, PyObject *mask, int writes,
                    Part *part, PyObject **held) {
    long m = PyLong_AsLong(mask);
    if (m == -1 && PyErr_Occurred()) return -1;
    int plain = !(writes && (m & self->meta)); /* else cached under a tuple: Python's part */
    Change *change = plain ? change_of(self, ch, number) : NULL;
    if (change && change->mask == m) { /* changed this tick, and the view's mask is the change's */
        if (!change->body) {
            PyObject *call[6] = {NULL, ch, mask, Py_True, Py_None, Py_False};
            PyObject *body = PyObject_VectorcallMethod(
                self->body, call + 1, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (!body) return -1;
            if (read_body(body, part) < 0) {
                Py_DECREF(body);
                return -1;
            }
            change->body = body;
            change->data = PyBytes_AS_STRING(part->data);
            change->size = PyBytes_GET_SIZE(part->data);
            change->length = part->length;
            change->array_at = part->array_at;
        }
        part->bytes = change->data;
        part->size = change->size;
        part->length = change->length;
        part->array_at = change->array_at;
        return 0;
    }
    PyObject *body = NULL;
    if (plain && Py_TYPE(ch) == self->channel_cls) {
        PyObject *known = SLOT(ch, self->ch[CH_KNOWN]), *cache = SLOT(ch, self->ch[CH_CACHE]);
        if (known && cache && PyLong_CheckExact(known) && PyDict_CheckExact(cache)) {
            long k = PyLong_AsLong(known);
            if (k == -1 && PyErr_Occurred()) return -1;
            PyObject *key = PyLong_FromLong(m & k);
            if (!key) return -1;
            body = PyDict_GetItemWithError(cache, key);
            Py_DECREF(key);
            if (body) Py_INCREF(body);
            else if (PyErr_Occurred()) return -1;
        }
    }
    if (!body) {
        PyObject *call[6] = {NULL, ch, mask, Py_True, Py_None, writes ? Py_True : Py_False};
        body = PyObject_VectorcallMethod(self->body, call + 1, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                         NULL);
        if (!body) return -1;
    }
    *held = body;
    if (read_body(body, part) < 0) return -1;
    part->bytes = PyBytes_AS_STRING(part->data);
    part->size = PyBytes_GET_SIZE(part->data);
    return 0;
}

/* splice(view, masks: dict) -> (data, arrays)
 * The entries [sid, body] of a LATEST view without a reduction for `masks` (sid -> mask, in
 * its order): each body as view.channels[sid].body(mask, True, None, view.writes[sid] == 1)
 * gives it, joined; `arrays` as codec.Entries holds them, (where the entry starts, where its
 * array's data starts) for each body with an `array_at`. */
static PyObject *router_splice(Router *self, PyObject *const *args, Py_ssize_t nargs) {
    if (router_ready(self) < 0) return NULL;
    if (nargs != 2 || Py_TYPE(args[0]) != self->view_cls || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "splice(view: View, masks: dict)");
        return NULL;
    }
    PyObject *view = args[0], *masks = args[1];
    PyObject *channels = typed_slot(view, self->v[V_CHANNELS], &PyList_Type, "View.channels");
    PyObject *writes = typed_slot(view, self->v[V_WRITES], &PyBytes_Type, "View.writes");
    if (!channels || !writes) return NULL;
    /* The sids `numbers` holds: Channel.body, called on a miss, runs Python code, which may
     * grow or shrink the list, never `numbers` (held below). */
    Py_ssize_t n_channels = PyList_GET_SIZE(channels);
    const int32_t *numbers = numbers_of(self, view, n_channels);
    if (!numbers) return NULL;
    /* Held: Channel.body, called on a miss, runs Python code. */
    Py_INCREF(channels);
    Py_INCREF(writes);
    Py_INCREF(SLOT(view, self->v[V_NUMBERS]));
    PyObject *numbers_held = SLOT(view, self->v[V_NUMBERS]);
    Py_ssize_t n = PyDict_GET_SIZE(masks), n_writes = PyBytes_GET_SIZE(writes);
    const unsigned char *w = (const unsigned char *)PyBytes_AS_STRING(writes);
    /* The pairs first, held: Channel.body, called on a miss, runs Python code. */
    PyObject **pairs = PyMem_Calloc(2 * (size_t)n + 1, sizeof(PyObject *));
    Part *parts = PyMem_Calloc((size_t)n + 1, sizeof(Part));
    PyObject *out = NULL, *arrays = NULL, *data = NULL;
    if (!pairs || !parts) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t pos = 0, k = 0;
    PyObject *sid, *mask;
    while (k < n && PyDict_Next(masks, &pos, &sid, &mask)) {
        pairs[2 * k] = Py_NewRef(sid);
        pairs[2 * k + 1] = Py_NewRef(mask);
        k++;
    }
    n = k;
    PyObject **bodies = pairs; /* each mask's place takes its body once read */
    Py_ssize_t size = 0, n_arrays = 0;
    for (k = 0; k < n; k++) {
        Py_ssize_t s = PyLong_AsSsize_t(pairs[2 * k]);
        if (s == -1 && PyErr_Occurred()) goto done;
        if (s < 0 || s >= n_channels || s >= PyList_GET_SIZE(channels) || s >= n_writes) {
            PyErr_Format(PyExc_IndexError, "splice: sid %zd out of range", s);
            goto done;
        }
        PyObject *body = NULL;
        int rc = body_for(self, PyList_GET_ITEM(channels, s), numbers[s], pairs[2 * k + 1],
                          w[s] == 1, &parts[k], &body);
        if (body) Py_SETREF(bodies[2 * k + 1], body);
        if (rc < 0) goto done;
        parts[k].sid = (uint64_t)s;
        size += header_size(parts[k].length) + uint_size(parts[k].sid) + parts[k].size;
        n_arrays += parts[k].array_at != 0;
    }
    data = PyBytes_FromStringAndSize(NULL, size);
    arrays = PyTuple_New(n_arrays);
    if (!data || !arrays) goto done;
    char *start = PyBytes_AS_STRING(data), *p = start;
    Py_ssize_t a = 0;
    for (k = 0; k < n; k++) {
        Part *part = &parts[k];
        Py_ssize_t at = p - start;
        p = put_header(p, part->length);
        p = put_uint(p, part->sid);
        if (part->array_at) {
            PyObject *where = Py_BuildValue("(nn)", at, (Py_ssize_t)(p - start) +
                                                            (Py_ssize_t)part->array_at);
            if (!where) goto done;
            PyTuple_SET_ITEM(arrays, a++, where);
        }
        memcpy(p, part->bytes, (size_t)part->size);
        p += part->size;
    }
    out = PyTuple_Pack(2, data, arrays);
done:
    if (pairs)
        for (k = 0; k < 2 * n; k++) Py_XDECREF(pairs[k]);
    PyMem_Free(pairs);
    PyMem_Free(parts);
    Py_DECREF(channels);
    Py_DECREF(writes);
    Py_DECREF(numbers_held);
    Py_XDECREF(data);
    Py_XDECREF(arrays);
    return out;
}

/* forget(): the tick is over; its changes are let go (a splice after it reads the channels). */
static PyObject *router_forget(Router *self, PyObject *Py_UNUSED(arg)) {
    forget_changes(self);
    Py_RETURN_NONE;
}

static PyMethodDef router_methods[] = {
    {"forget", (PyCFunction)router_forget, METH_NOARGS,
     "forget(): let go of the tick's changes, which splices use until then."},
    {"route", (PyCFunction)(void (*)(void))router_route, METH_FASTCALL,
     "route(dirty, active, add_one, token, handed): each dirty channel's change into its "
     "views."},
    {"splice", (PyCFunction)(void (*)(void))router_splice, METH_FASTCALL,
     "splice(view, masks) -> (data, arrays): a LATEST view's entries for masks."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RouterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pvwire.core._tick.Router",
    .tp_basicsize = sizeof(Router),
    .tp_dealloc = (destructor)router_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Router(channel_cls, view_cls, meta): routes the tick's changes to views and "
              "splices views' entries, reading instances of exactly these classes.",
    .tp_methods = router_methods,
    .tp_init = (initproc)router_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pvwire.core._tick",
    "The tick's compiled parts (core/tick.py, core/view.py).", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__tick(void) {
    if (PyType_Ready(&RouterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Router", (PyObject *)&RouterType) < 0 ||
        add_names(m, "CHANNEL_SLOTS", CHANNEL_SLOTS, N_CHANNEL_SLOTS) < 0 ||
        add_names(m, "VIEW_SLOTS", VIEW_SLOTS, N_VIEW_SLOTS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
