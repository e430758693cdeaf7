/* What pvwire's compiled modules share (core/_journal.c, core/_tick.c): reading and writing the
 * slots of instances of exactly a Python class, at the offsets its member descriptors give, and
 * exporting the names read, for the Python side to check its declarations against at import.
 * Included once by each module; every function is static. */

#ifndef PVWIRE_SLOTS_H
#define PVWIRE_SLOTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* The slot at `offset` of an instance of exactly the class the offset came from. */
#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* Where a class declares each of `names` as a writable object slot of its own; -1 and an
 * error if one is not (AttributeError for a name it lacks, TypeError for one that is not such a
 * slot, naming `who`). */
static int slot_offsets(PyObject *cls, const char *const *names, int n, Py_ssize_t *offset,
                        const char *who) {
    for (int k = 0; k < n; k++) {
        PyObject *d = PyObject_GetAttrString(cls, names[k]);
        if (!d) return -1;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                 PyDescr_TYPE(d) == (PyTypeObject *)cls &&
                 ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX &&
                 !(((PyMemberDescrObject *)d)->d_member->flags & READONLY);
        if (ok) offset[k] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s: %s.%s is not a writable slot of its own", who,
                         ((PyTypeObject *)cls)->tp_name, names[k]);
            return -1;
        }
    }
    return 0;
}

/* `names` as a module attribute, a tuple of str: the slots a class must declare. */
static int add_names(PyObject *m, const char *attr, const char *const *names, int n) {
    PyObject *t = PyTuple_New(n);
    if (!t) return -1;
    for (int k = 0; k < n; k++) {
        PyObject *s = PyUnicode_FromString(names[k]);
        if (!s) {
            Py_DECREF(t);
            return -1;
        }
        PyTuple_SET_ITEM(t, k, s);
    }
    int rc = PyModule_AddObjectRef(m, attr, t);
    Py_DECREF(t);
    return rc;
}

#endif
