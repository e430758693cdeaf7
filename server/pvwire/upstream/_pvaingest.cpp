// PVA monitors for pvwire: pvxs subscriptions whose updates reach Python in batches.
//
// Why compiled (bench/README.md, "Per-update cost, fourth pass"): through p4p, each update of a
// 10 Hz PV cost pvxs's worker thread a GIL acquisition for the wake-up callback, and the loop a
// GIL release and re-acquisition per pop, a Python Value and three name walks. Here pvxs's
// worker thread never takes the GIL: its wake-up callback only queues the subscription. The
// loop's drain() pops each queued subscription with the GIL held (a pop is a short lock in pvxs)
// and reads an ordinary update (only value and timeStamp changed, a plain scalar or array) in
// C++, calling the channel's on_update directly. Everything else (the first update after a
// connect, changed alarm or metadata, other types, disconnects) goes to the Python handler as
// p4p's own Value or exception, so the rules of pva.py stay the only rules.
//
// Threads: the wake-up callback runs on pvxs's worker thread and touches only `Woken` (under its
// mutex) and a weak reference to the subscription. Everything that touches a Python object runs
// with the GIL held on the thread that calls drain() or close().
//
// Exceptions: every function that Python or pvxs calls is an entry point (ENTRY below, or the
// wake-up callback's own try) that catches everything; a C++ exception never unwinds into
// Python's C API or pvxs's worker thread. It becomes a Python exception for the caller, or,
// where there is none (deallocation), an unraisable-exception report.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <pvxs/client.h>
#include <pvxs/data.h>

namespace {

using pvxs::ArrayType;
using pvxs::StoreType;
using pvxs::Value;
using pvxs::shared_array;
namespace client = pvxs::client;

// From p4p._p4p: its Value from a pvxs Value (a capsule of p4p's C API), and its exceptions.
PyObject* (*pack_value)(const Value&) = nullptr;
PyObject* disconnected_type = nullptr;
PyObject* finished_type = nullptr;
PyObject* remote_error_type = nullptr;

// Owned Python reference; releases on scope exit.
struct Ref {
    PyObject* obj;
    explicit Ref(PyObject* o = nullptr) : obj(o) {}
    // A new reference to a borrowed object (null stays null): held over a call that may drop
    // the borrowed one.
    static PyObject* held(PyObject* o) {
        Py_XINCREF(o);
        return o;
    }
    Ref(const Ref&) = delete;
    Ref& operator=(const Ref&) = delete;
    ~Ref() { Py_XDECREF(obj); }
};

// The GIL released for a scope; taken again on leaving it, an exception included (which
// Py_BEGIN_ALLOW_THREADS would skip).
struct GilReleased {
    PyThreadState* state;
    GilReleased() : state(PyEval_SaveThread()) {}
    GilReleased(const GilReleased&) = delete;
    GilReleased& operator=(const GilReleased&) = delete;
    ~GilReleased() { PyEval_RestoreThread(state); }
};

// ---- entry points ---------------------------------------------------------------------------

// Set the Python error for the C++ exception being handled (call only inside a catch block).
void set_python_error() noexcept {
    try {
        throw;
    } catch (const std::bad_alloc&) {
        PyErr_NoMemory();
    } catch (const std::exception& e) {
        PyErr_Format(PyExc_RuntimeError, "pvwire PVA module: %s", e.what());
    } catch (...) {
        PyErr_SetString(PyExc_RuntimeError, "pvwire PVA module: unknown C++ exception");
    }
}

// Entry<decltype(&f), &f>::call is f behind a catch-all: what escapes f is a Python exception
// (nullptr or -1 returned), or for a void f (deallocation) an unraisable-exception report.
template <typename Signature, Signature F>
struct Entry;

template <typename R, typename... Args, R (*F)(Args...)>
struct Entry<R (*)(Args...), F> {
    static R call(Args... args) noexcept {
        try {
            return F(args...);
        } catch (...) {
            set_python_error();
            if constexpr (std::is_void_v<R>) {
                PyErr_WriteUnraisable(nullptr);
            } else if constexpr (std::is_pointer_v<R>) {
                return nullptr;
            } else {
                return -1;
            }
        }
    }
};

#define ENTRY(f) (&Entry<decltype(&f), &f>::call)

struct Sub;

// Subscriptions whose FIFO went from empty to not empty: filled by pvxs's worker thread,
// emptied by drain(). A subscription is queued at most once per wake-up.
struct Woken {
    std::mutex lock;
    std::vector<std::shared_ptr<Sub>> subs;
    // Set on pvxs's thread when queueing a subscription failed (out of memory): that
    // subscription is not woken again until a pop finds its FIFO empty. drain() reports it.
    std::atomic<bool> lost{false};

    void push(std::shared_ptr<Sub>&& sub) {
        std::lock_guard<std::mutex> g(lock);
        subs.push_back(std::move(sub));
    }
};

// One subscription. The Python fields are touched only with the GIL held.
struct Sub {
    std::shared_ptr<client::Subscription> op;  // null once closed
    PyObject* on_update = nullptr;  // sink.on_update(value, secs, nsec, severity, status, message)
    PyObject* on_item = nullptr;    // handler(p4p Value or exception) for everything else
    PyObject* on_failure = nullptr; // failure(exception) when on_update raised
    PyObject* alarm[3] = {nullptr, nullptr, nullptr};  // for ordinary updates, set by fast()
    bool fast = false;  // whether an ordinary update may bypass on_item
    // Where value and timeStamp sit among the structure's fields, and seconds and nanoseconds
    // within timeStamp: learnt by name from the first update after fast(). Every update of one
    // connection has the same type, and a new connection's first update comes after an
    // exception, through on_item, before fast() is called again.
    struct Layout {
        bool known = false;
        size_t value = 0, time = 0, seconds = 0, nanoseconds = 0;
    } layout;

    void clear_python() {
        fast = false;
        Py_CLEAR(on_update);
        Py_CLEAR(on_item);
        Py_CLEAR(on_failure);
        for (auto& a : alarm) Py_CLEAR(a);
    }
};

// ---- ordinary updates -----------------------------------------------------------------------

// A readonly ndarray over pvxs's array memory, kept alive by a capsule (p4p does the same).
void free_array(PyObject* capsule) {
    delete static_cast<shared_array<const void>*>(PyCapsule_GetPointer(capsule, "pvwire.array"));
}

PyObject* numeric_array(const shared_array<const void>& arr) {
    int type;
    switch (arr.original_type()) {
        case ArrayType::Int8: type = NPY_INT8; break;
        case ArrayType::Int16: type = NPY_INT16; break;
        case ArrayType::Int32: type = NPY_INT32; break;
        case ArrayType::Int64: type = NPY_INT64; break;
        case ArrayType::UInt8: type = NPY_UINT8; break;
        case ArrayType::UInt16: type = NPY_UINT16; break;
        case ArrayType::UInt32: type = NPY_UINT32; break;
        case ArrayType::UInt64: type = NPY_UINT64; break;
        case ArrayType::Float32: type = NPY_FLOAT32; break;
        case ArrayType::Float64: type = NPY_FLOAT64; break;
        default: return nullptr;  // Bool, Null, Value: pva.py's rules
    }
    auto* held = new shared_array<const void>(arr);
    Ref base(PyCapsule_New(held, "pvwire.array", ENTRY(free_array)));
    if (!base.obj) {
        delete held;
        return nullptr;
    }
    npy_intp shape = static_cast<npy_intp>(arr.size());
    Ref out(PyArray_New(&PyArray_Type, 1, &shape, type, nullptr, const_cast<void*>(arr.data()),
                        0, NPY_ARRAY_CARRAY_RO, nullptr));
    if (!out.obj) return nullptr;
    PyObject* owner = base.obj;
    base.obj = nullptr;
    if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(out.obj), owner) < 0) return nullptr;
    PyObject* ret = out.obj;
    out.obj = nullptr;
    return ret;
}

PyObject* string_list(const shared_array<const void>& arr) {
    auto strings = arr.castTo<const std::string>();
    Ref out(PyList_New(static_cast<Py_ssize_t>(strings.size())));
    if (!out.obj) return nullptr;
    for (size_t i = 0; i < strings.size(); i++) {
        PyObject* s = PyUnicode_FromString(strings[i].c_str());
        if (!s) return nullptr;
        PyList_SET_ITEM(out.obj, static_cast<Py_ssize_t>(i), s);
    }
    PyObject* ret = out.obj;
    out.obj = nullptr;
    return ret;
}

// The value as pva.py's fast path gives it (int, float, str, a plain readonly ndarray, a list of
// str), or nullptr: with a Python error set if converting failed, without if another path must
// read it.
PyObject* plain_value(const Value& val) {
    switch (val.storageType()) {
        case StoreType::Integer: return PyLong_FromLongLong(val.as<int64_t>());
        case StoreType::UInteger: return PyLong_FromUnsignedLongLong(val.as<uint64_t>());
        case StoreType::Real: return PyFloat_FromDouble(val.as<double>());
        case StoreType::String:
            return PyUnicode_FromString(val.as<std::string>().c_str());  // as p4p: up to a NUL
        case StoreType::Array: {
            auto arr = val.as<shared_array<const void>>();
            if (arr.original_type() == ArrayType::String) return string_list(arr);
            return numeric_array(arr);
        }
        default: return nullptr;
    }
}

const std::string VALUE("value"), TIME_STAMP("timeStamp"), SECONDS("secondsPastEpoch"),
    NANOSECONDS("nanoseconds");

// The position of `field` among `parent`'s fields, or false.
bool position(const Value& parent, const Value& field, size_t& out) {
    size_t i = 0;
    for (const auto& child : parent.ichildren()) {
        if (child.equalInst(field)) {
            out = i;
            return true;
        }
        i++;
    }
    return false;
}

// Learn where value, timeStamp, seconds and nanoseconds are (Sub::Layout), by name.
bool learn(Sub::Layout& layout, const Value& v) {
    const Value val(v[VALUE]);
    const Value ts(v[TIME_STAMP]);
    if (!val || !ts) return false;
    const Value secs(ts[SECONDS]);
    const Value nsec(ts[NANOSECONDS]);
    if (!secs || !nsec) return false;
    layout.known = position(v, val, layout.value) && position(v, ts, layout.time) &&
                   position(ts, secs, layout.seconds) && position(ts, nsec, layout.nanoseconds);
    return layout.known;
}

enum class Fast { delivered, declined, failed };

// Deliver an ordinary update (nothing but value and timeStamp changed: pva.py's _PLAIN_CHANGES)
// to on_update. `declined`: not ordinary or not a type read here (no Python error set).
// `failed`: a Python error is set (converting, or on_update raised).
//
// Fields are found by position (Sub::Layout), not by name: a lookup by name is a search of
// the structure's name map, cold for each PV's update among 1,000 others, and the four of them
// took 13 % of the server's samples (perf, 1,000 PVs); Value::nameOf, a walk of that map, 11 %.
Fast deliver_fast(Sub& sub, const Value& v) {
    PyObject* args[6] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
    try {
        const Sub::Layout& layout = sub.layout;
        if (!layout.known && !learn(sub.layout, v)) return Fast::declined;
        Value val, ts, secs_field, nsec_field;
        size_t i = 0;
        for (const auto& field : v.ichildren()) {
            if (i == layout.value) {
                val = field;
            } else if (i == layout.time) {
                ts = field;
            } else if (field.isMarked(true, true)) {
                return Fast::declined;  // alarm, metadata or another field changed
            }
            i++;
        }
        if (!val || !ts) return Fast::declined;
        i = 0;
        for (const auto& field : ts.ichildren()) {
            if (i == layout.seconds) secs_field = field;
            if (i == layout.nanoseconds) nsec_field = field;
            i++;
        }
        if (!secs_field || !nsec_field) return Fast::declined;
        const int64_t secs = secs_field.as<int64_t>();
        const int64_t nsec = nsec_field.as<int64_t>();
        args[0] = plain_value(val);
        if (!args[0]) return PyErr_Occurred() ? Fast::failed : Fast::declined;
        args[1] = PyLong_FromLongLong(secs);
        args[2] = PyLong_FromLongLong(nsec);
    } catch (...) {
        return Fast::declined;  // pvxs could not read a field as asked: let p4p and pva.py try
    }
    Ref value(args[0]), secs(args[1]), nsec(args[2]);
    if (!secs.obj || !nsec.obj) return Fast::failed;
    // Allocating may have run the garbage collector, whose tp_clear empties an unreachable
    // subscription's Python fields: read them only now, and hold them over the call.
    if (!sub.fast || !sub.on_update) return Fast::declined;
    Ref on_update(Ref::held(sub.on_update)), sev(Ref::held(sub.alarm[0])),
        stat(Ref::held(sub.alarm[1])), msg(Ref::held(sub.alarm[2]));
    args[3] = sev.obj;
    args[4] = stat.obj;
    args[5] = msg.obj;
    Ref ret(PyObject_Vectorcall(on_update.obj, args, 6, nullptr));
    return ret.obj ? Fast::delivered : Fast::failed;
}

// Call handler(arg) for its effects; an exception it lets out is reported, never raised here.
void call_handler(PyObject* handler, PyObject* arg) {
    Ref ret(PyObject_CallOneArg(handler, arg));
    if (!ret.obj) PyErr_WriteUnraisable(handler);
}

// ---- Python types ---------------------------------------------------------------------------

struct SubscriptionObject {
    PyObject_HEAD
    std::shared_ptr<Sub> sub;
};

struct IngestObject {
    PyObject_HEAD
    client::Context* ctxt;  // null once closed
    std::shared_ptr<Woken> woken;
    Value* request;         // the pvRequest of every monitor
};

PyTypeObject SubscriptionType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject IngestType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// Cancel the subscription and drop the Python references. pvxs's cancel waits for a wake-up
// callback in progress, which never waits for the GIL: release it meanwhile all the same.
void close_sub(Sub& sub) {
    sub.clear_python();
    std::shared_ptr<client::Subscription> op;
    op.swap(sub.op);
    if (op) {
        GilReleased unlocked;
        try {
            op->cancel();
        } catch (...) {
            // cancel() ends the operation whatever it reports; nothing is delivered after it
        }
        op.reset();
    }
}

PyObject* sub_close(SubscriptionObject* self, PyObject*) {
    if (self->sub) close_sub(*self->sub);
    Py_RETURN_NONE;
}

PyObject* sub_fast(SubscriptionObject* self, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "fast(severity, status, message) takes 3 arguments");
        return nullptr;
    }
    Sub& sub = *self->sub;
    if (!sub.op) Py_RETURN_NONE;  // closed: nothing will be delivered
    for (int i = 0; i < 3; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(sub.alarm[i], args[i]);
    }
    sub.fast = true;
    sub.layout.known = false;
    Py_RETURN_NONE;
}

PyObject* sub_get_fast(SubscriptionObject* self, void*) {
    return PyBool_FromLong(self->sub && self->sub->fast);
}

PyObject* sub_get_closed(SubscriptionObject* self, void*) {
    return PyBool_FromLong(!self->sub || !self->sub->op);
}

int sub_traverse(SubscriptionObject* self, visitproc visit, void* arg) {
    if (self->sub) {
        Sub& s = *self->sub;
        Py_VISIT(s.on_update);
        Py_VISIT(s.on_item);
        Py_VISIT(s.on_failure);
        for (auto* a : s.alarm) Py_VISIT(a);
    }
    return 0;
}

int sub_clear(SubscriptionObject* self) {
    if (self->sub) self->sub->clear_python();
    return 0;
}

void sub_dealloc(SubscriptionObject* self) {
    PyObject_GC_UnTrack(self);
    if (self->sub) close_sub(*self->sub);
    self->sub.~shared_ptr<Sub>();
    Py_TYPE(self)->tp_free(self);
}

PyMethodDef sub_methods[] = {
    {"close", reinterpret_cast<PyCFunction>(ENTRY(sub_close)), METH_NOARGS,
     "Cancel the subscription; nothing is delivered after this returns."},
    {"fast", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(ENTRY(sub_fast))), METH_FASTCALL,
     "fast(severity, status, message): deliver ordinary updates straight to on_update, with "
     "this alarm, until anything else arrives."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef sub_getset[] = {
    {"is_fast", reinterpret_cast<getter>(ENTRY(sub_get_fast)), nullptr,
     "Whether ordinary updates bypass the handler.", nullptr},
    {"closed", reinterpret_cast<getter>(ENTRY(sub_get_closed)), nullptr,
     "Whether close() was called.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

// Ingest(request: str)
int ingest_init(IngestObject* self, PyObject* args, PyObject* kwargs) {
    static const char* names[] = {"request", nullptr};
    const char* request;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s", const_cast<char**>(names), &request))
        return -1;
    try {
        Value req(client::Context::request().pvRequest(request).build());
        client::Context* ctxt;
        {
            GilReleased unlocked;  // pvxs starts its threads and opens its sockets
            ctxt = new client::Context(client::Context::fromEnv());
        }
        delete self->ctxt;
        delete self->request;
        self->ctxt = ctxt;
        self->request = new Value(std::move(req));
        self->woken = std::make_shared<Woken>();
    } catch (std::exception& e) {
        PyErr_SetString(PyExc_ValueError, e.what());
        return -1;
    }
    return 0;
}

PyObject* ingest_new(PyTypeObject* type, PyObject*, PyObject*) {
    auto* self = reinterpret_cast<IngestObject*>(type->tp_alloc(type, 0));
    if (!self) return nullptr;
    self->ctxt = nullptr;
    new (&self->woken) std::shared_ptr<Woken>();
    self->request = nullptr;
    return reinterpret_cast<PyObject*>(self);
}

void close_ingest(IngestObject* self) {
    client::Context* ctxt = self->ctxt;
    self->ctxt = nullptr;
    if (ctxt) {
        GilReleased unlocked;
        try {
            ctxt->close();
        } catch (...) {
            // closing aborts every operation whatever it reports; the context is freed below
        }
        delete ctxt;
    }
}

void ingest_dealloc(IngestObject* self) {
    close_ingest(self);
    delete self->request;
    self->woken.~shared_ptr<Woken>();
    Py_TYPE(self)->tp_free(self);
}

PyObject* ingest_close(IngestObject* self, PyObject*) {
    close_ingest(self);
    Py_RETURN_NONE;
}

// subscribe(name, on_update, on_item, on_failure) -> Subscription
PyObject* ingest_subscribe(IngestObject* self, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "subscribe(name: str, on_update, on_item, on_failure) takes 4 arguments");
        return nullptr;
    }
    if (!self->ctxt) {
        PyErr_SetString(PyExc_RuntimeError, "PVA ingest closed");
        return nullptr;
    }
    Py_ssize_t len;
    const char* name = PyUnicode_AsUTF8AndSize(args[0], &len);
    if (!name) return nullptr;
    auto sub_ptr = std::make_shared<Sub>();
    auto* obj = PyObject_GC_New(SubscriptionObject, &SubscriptionType);
    if (!obj) return nullptr;
    new (&obj->sub) std::shared_ptr<Sub>(std::move(sub_ptr));
    Ref ret(reinterpret_cast<PyObject*>(obj));
    Sub& sub = *obj->sub;
    Py_INCREF(args[1]);
    sub.on_update = args[1];
    Py_INCREF(args[2]);
    sub.on_item = args[2];
    Py_INCREF(args[3]);
    sub.on_failure = args[3];
    PyObject_GC_Track(obj);
    // The callback holds the subscription weakly: pvxs stores it in the operation, which the
    // subscription owns. It may run before exec() returns; drain() runs on this thread, so it
    // sees `op` set (the subscribe-time loss of p4p's thread client cannot happen here).
    std::weak_ptr<Sub> weak(obj->sub);
    std::shared_ptr<Woken> woken(self->woken);
    try {
        sub.op = self->ctxt->monitor(std::string(name, len))
                     .maskConnected(true)
                     .maskDisconnected(false)
                     .rawRequest(*self->request)
                     .event([weak, woken](client::Subscription&) noexcept {
                         // pvxs's worker thread: nothing may escape, and no GIL to report with
                         try {
                             if (auto s = weak.lock()) woken->push(std::move(s));
                         } catch (...) {
                             woken->lost = true;
                         }
                     })
                     .exec();
    } catch (std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    }
    PyObject* out = ret.obj;
    ret.obj = nullptr;
    return out;
}

// One item for the Python handler: p4p's exception for what pop() threw.
PyObject* exception_item(PyObject* type, const char* what) {
    return PyObject_CallFunction(type, "s", what);
}

// Pop and deliver one subscription's updates, at most max_pops. Returns whether its FIFO may
// still hold some (pvxs wakes it again only after a pop found the FIFO empty).
bool drain_one(Sub& sub, long max_pops) {
    for (long n = 0; n < max_pops; n++) {
        if (!sub.op) return false;  // closed, perhaps by a handler during this drain
        Value v;
        PyObject* error_type = nullptr;
        std::string what;
        try {
            v = sub.op->pop();
        } catch (client::Finished& e) {
            error_type = finished_type;
            what = e.what();
        } catch (client::Disconnect& e) {
            error_type = disconnected_type;
            what = e.what();
        } catch (client::RemoteError& e) {
            error_type = remote_error_type;
            what = e.what();
        } catch (std::exception& e) {
            error_type = PyExc_RuntimeError;
            what = e.what();
        } catch (...) {
            error_type = PyExc_RuntimeError;
            what = "unknown C++ exception from pvxs";
        }
        if (!error_type && !v) return false;  // empty
        if (!error_type && sub.fast) {
            switch (deliver_fast(sub, v)) {
                case Fast::delivered: continue;
                case Fast::declined: break;
                case Fast::failed: {
                    sub.fast = false;
                    PyObject* type;
                    PyObject* value;
                    PyObject* tb;
                    PyErr_Fetch(&type, &value, &tb);
                    PyErr_NormalizeException(&type, &value, &tb);
                    if (tb) PyException_SetTraceback(value, tb);
                    Ref t(type), val(value), trace(tb);
                    Ref failure(Ref::held(sub.on_failure));
                    if (failure.obj && val.obj) call_handler(failure.obj, val.obj);
                    continue;
                }
            }
        }
        sub.fast = false;  // the handler turns it on again when the next may be ordinary
        Ref item(error_type ? exception_item(error_type, what.c_str()) : pack_value(v));
        Ref handler(Ref::held(sub.on_item));
        if (!item.obj) {
            PyErr_WriteUnraisable(handler.obj);
            continue;
        }
        if (handler.obj) call_handler(handler.obj, item.obj);
    }
    return true;
}

// drain(max_pops): deliver what the subscriptions woken so far hold, up to max_pops each; one
// still busy goes back in the queue for the next drain, so one fast PV cannot hold up the rest.
PyObject* ingest_drain(IngestObject* self, PyObject* arg) {
    const long max_pops = PyLong_AsLong(arg);
    if (max_pops == -1 && PyErr_Occurred()) return nullptr;
    if (max_pops < 1) {
        PyErr_SetString(PyExc_ValueError, "max_pops must be at least 1");
        return nullptr;
    }
    if (!self->woken) Py_RETURN_NONE;
    Woken& woken = *self->woken;
    std::vector<std::shared_ptr<Sub>> batch;
    {
        std::lock_guard<std::mutex> g(woken.lock);
        batch.swap(woken.subs);
    }
    // Those still busy, and if drain_one throws, every one not drained yet: back in the queue
    // (on unwinding too), or pvxs, which wakes a subscription only once, would never wake them.
    struct Requeue {
        Woken& woken;
        std::vector<std::shared_ptr<Sub>>& batch;
        size_t done = 0;
        std::vector<std::shared_ptr<Sub>> again;
        ~Requeue() {
            try {
                std::lock_guard<std::mutex> g(woken.lock);
                for (auto& sub : again) woken.subs.push_back(std::move(sub));
                for (size_t i = done; i < batch.size(); i++) {
                    if (batch[i]) woken.subs.push_back(std::move(batch[i]));
                }
            } catch (...) {
                woken.lost = true;  // out of memory: reported by the next drain
            }
        }
    } requeue{woken, batch};
    requeue.again.reserve(batch.size());  // push_back below cannot throw
    for (; requeue.done < batch.size(); requeue.done++) {
        auto& sub = batch[requeue.done];
        if (drain_one(*sub, max_pops)) requeue.again.push_back(std::move(sub));
    }
    if (woken.lost.exchange(false)) {
        PyErr_SetString(PyExc_MemoryError,
                        "a PVA subscription's wake-up was lost (out of memory on pvxs's thread): "
                        "its channel may stop updating");
        return nullptr;
    }
    Py_RETURN_NONE;
}

PyObject* ingest_get_request(IngestObject* self, void*) {
    if (!self->request) Py_RETURN_NONE;
    return pack_value(*self->request);
}

PyMethodDef ingest_methods[] = {
    {"subscribe", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(ENTRY(ingest_subscribe))),
     METH_FASTCALL,
     "subscribe(name, on_update, on_item, on_failure) -> Subscription on this context."},
    {"drain", reinterpret_cast<PyCFunction>(ENTRY(ingest_drain)), METH_O,
     "drain(max_pops): deliver the woken subscriptions' updates on this thread."},
    {"close", reinterpret_cast<PyCFunction>(ENTRY(ingest_close)), METH_NOARGS,
     "Close the context: every subscription on it ends."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef ingest_getset[] = {
    {"request", reinterpret_cast<getter>(ENTRY(ingest_get_request)), nullptr,
     "The pvRequest of every monitor, as p4p's Value.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "pvwire.upstream._pvaingest",
                          "PVA monitors whose updates reach Python in batches.", -1, nullptr};

bool import_p4p() {
    Ref p4p(PyImport_ImportModule("p4p._p4p"));
    if (!p4p.obj) return false;
    Ref capi(PyObject_GetAttrString(p4p.obj, "__pyx_capi__"));
    if (!capi.obj) return false;
    PyObject* pack = PyDict_GetItemString(capi.obj, "pvxs_pack");  // borrowed
    if (!pack) {
        PyErr_SetString(PyExc_ImportError, "p4p._p4p exports no pvxs_pack");
        return false;
    }
    pack_value = reinterpret_cast<PyObject* (*)(const Value&)>(
        PyCapsule_GetPointer(pack, "PyObject *(pvxs::Value const &)"));
    if (!pack_value) return false;
    disconnected_type = PyObject_GetAttrString(p4p.obj, "Disconnected");
    finished_type = PyObject_GetAttrString(p4p.obj, "Finished");
    remote_error_type = PyObject_GetAttrString(p4p.obj, "RemoteError");
    return disconnected_type && finished_type && remote_error_type;
}

PyObject* init_module() {
    import_array();
    if (!import_p4p()) return nullptr;

    SubscriptionType.tp_name = "pvwire.upstream._pvaingest.Subscription";
    SubscriptionType.tp_basicsize = sizeof(SubscriptionObject);
    SubscriptionType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
    SubscriptionType.tp_doc = "One PVA monitor, from Ingest.subscribe.";
    SubscriptionType.tp_dealloc = reinterpret_cast<destructor>(ENTRY(sub_dealloc));
    SubscriptionType.tp_traverse = reinterpret_cast<traverseproc>(ENTRY(sub_traverse));
    SubscriptionType.tp_clear = reinterpret_cast<inquiry>(ENTRY(sub_clear));
    SubscriptionType.tp_methods = sub_methods;
    SubscriptionType.tp_getset = sub_getset;
    if (PyType_Ready(&SubscriptionType) < 0) return nullptr;

    IngestType.tp_name = "pvwire.upstream._pvaingest.Ingest";
    IngestType.tp_basicsize = sizeof(IngestObject);
    IngestType.tp_flags = Py_TPFLAGS_DEFAULT;
    IngestType.tp_doc = "Ingest(request): a pvxs client context (from EPICS_PVA_*) for monitors.";
    IngestType.tp_new = ENTRY(ingest_new);
    IngestType.tp_init = reinterpret_cast<initproc>(ENTRY(ingest_init));
    IngestType.tp_dealloc = reinterpret_cast<destructor>(ENTRY(ingest_dealloc));
    IngestType.tp_methods = ingest_methods;
    IngestType.tp_getset = ingest_getset;
    if (PyType_Ready(&IngestType) < 0) return nullptr;

    PyObject* m = PyModule_Create(&module_def);
    if (!m) return nullptr;
    Py_INCREF(&IngestType);
    if (PyModule_AddObject(m, "Ingest", reinterpret_cast<PyObject*>(&IngestType)) < 0) {
        Py_DECREF(&IngestType);
        Py_DECREF(m);
        return nullptr;
    }
    Py_INCREF(&SubscriptionType);
    if (PyModule_AddObject(m, "Subscription", reinterpret_cast<PyObject*>(&SubscriptionType)) < 0) {
        Py_DECREF(&SubscriptionType);
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}

}  // namespace

PyMODINIT_FUNC PyInit__pvaingest(void) { return ENTRY(init_module)(); }
