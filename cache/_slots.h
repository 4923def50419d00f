/* Reading an object's ``__slots__`` field by offset: the hot reads of the cache's C (the
   ledger's ``state``, cache/_ledger.c; the attribute builders' ``Fields``, cache/_native.c).
   Both include this file.

   A ``slot_hint`` remembers where a type keeps an attribute as a plain object slot: valid while
   the type is ``type`` with version tag ``version`` (CPython gives a type a new tag whenever it
   or a base changes, and never reuses one, so the borrowed pointer is only ever compared). */

#ifndef RADIXSCOPE_SLOTS_H
#define RADIXSCOPE_SLOTS_H

#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX */

typedef struct {
    PyTypeObject *type;
    unsigned int version;
    Py_ssize_t offset;
} slot_hint;

/* A type's version tag is valid: never 0 (a type changed, or out of tags, has 0); before 3.13
   also flagged (3.13 keeps the tag alone). */
#if PY_VERSION_HEX >= 0x030D0000
#define TAG_VALID(tp) ((tp)->tp_version_tag != 0)
#else
#define TAG_VALID(tp) \
    (PyType_HasFeature((tp), Py_TPFLAGS_VALID_VERSION_TAG) && (tp)->tp_version_tag != 0)
#endif

/* ``h`` learns where ``tp`` keeps ``name``: a plain object slot (a member descriptor of a
   ``__slots__`` class, found on the type's MRO, read by the generic getattr) or nothing (a
   property, a class attribute, a ``__getattribute__`` or ``__getattr__`` of its own). */
static inline void
slot_learn(PyTypeObject *tp, PyObject *name, slot_hint *h)
{
    h->type = NULL;
    if (tp->tp_getattro != PyObject_GenericGetAttr)
        return;
    PyObject *d = _PyType_Lookup(tp, name); /* borrowed; no error set */
    if (d == NULL || Py_TYPE(d) != &PyMemberDescr_Type
        || !PyType_IsSubtype(tp, PyDescr_TYPE(d))
        || !TAG_VALID(tp))
        return;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX)
        return;
    h->type = tp;
    h->version = tp->tp_version_tag;
    h->offset = m->offset;
}

/* ``PyObject_GetAttr(obj, name)``, one load where ``h`` knows ``obj``'s type keeps ``name`` in
   a slot (a member descriptor is a data descriptor: nothing on the instance shadows it). The
   type is held across the generic read: code it runs (a property) may change ``obj``'s class
   and free the old one before ``slot_learn`` reads it. */
static inline PyObject *
slot_get(PyObject *obj, PyObject *name, slot_hint *h)
{
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp == h->type && tp->tp_version_tag == h->version && TAG_VALID(tp)) {
        PyObject *v = *(PyObject **)((char *)obj + h->offset);
        if (v != NULL)
            return Py_NewRef(v);
    }
    Py_INCREF(tp);
    PyObject *v = PyObject_GetAttr(obj, name); /* (raises what it raises; unset: AttributeError) */
    if (v != NULL)
        slot_learn(tp, name, h);
    Py_DECREF(tp);
    return v;
}

#endif
