/* FULL's evictable leaves on one tier as an indexed min-heap (``radixscope.cache._leafheap``).

``cache/leaves.py`` documents the interface and holds ``PyLeafHeap``, the Python version this
one must behave as (tests/cache/test_leaf_heaps.py drives both with the same operations and
compares every victim). A ``LeafHeap`` is the set of a tier's evictable leaf ids and their
order at once: each id has exactly one entry, ``(tick, id)``, ordered by tick then id, and a
hash index from id to the entry's place, so ``discard`` takes an entry out in O(log n) the
moment its node stops being a leaf. Eviction never meets the entries of nodes that became
internal or left the tree (a heap of ints in ``heapq`` can only drop those when they surface:
bursts of them made the slowest evict calls).

- ``file(id, tick)`` puts ``id`` in at ``tick``, or moves it there when it is in already;
- ``discard(id)`` takes it out (nothing when it is not in);
- ``pop_lru(nodes)`` takes out and returns the node (from ``nodes``, the tree's id -> node
  dict) of the least recently used leaf: an entry whose node's ``last_access`` moved past its
  tick since it was filed (recency never files: ``touch`` only raises ``last_access``) is moved
  to the node's tick first, so the node returned is exact LRU; None when empty;
- ``items()`` lists ``(id, tick)``; ``violations()`` the broken rules of the structure itself
  (heap order, index), for ``check()``; ``len``, ``in`` and iteration (over ids) as a set's.

Ids and ticks are ints in 0 .. 2**64-1. ``LEAFHEAP_ABI`` changes whenever the interface does:
``leaves.py`` refuses a build whose number is not its own. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define LEAFHEAP_ABI 1

typedef struct {
    uint64_t tick, id;
    Py_ssize_t slot; /* its place in the index */
} Entry;

typedef struct {
    uint64_t id;
    Py_ssize_t pos; /* its entry's place in the heap; -1: an empty slot */
} Slot;

typedef struct {
    PyObject_HEAD
    Entry *heap;
    Py_ssize_t n, cap;
    Slot *slots; /* open addressing, linear probing, at most half full */
    Py_ssize_t mask;
} LeafHeap;

static PyObject *str_last_access;

static inline Py_ssize_t
home(const LeafHeap *h, uint64_t id)
{
    uint64_t x = id * 0x9E3779B97F4A7C15ULL;
    return (Py_ssize_t)((x ^ (x >> 32)) & (uint64_t)h->mask);
}

static inline int
less(const Entry *a, const Entry *b)
{
    return a->tick < b->tick || (a->tick == b->tick && a->id < b->id);
}

static inline void
place(LeafHeap *h, Py_ssize_t p, Entry e)
{
    h->heap[p] = e;
    h->slots[e.slot].pos = p;
}

static void
sift_up(LeafHeap *h, Py_ssize_t p)
{
    Entry e = h->heap[p];
    while (p > 0) {
        Py_ssize_t parent = (p - 1) / 2;
        if (!less(&e, &h->heap[parent]))
            break;
        place(h, p, h->heap[parent]);
        p = parent;
    }
    place(h, p, e);
}

static void
sift_down(LeafHeap *h, Py_ssize_t p)
{
    Entry e = h->heap[p];
    for (;;) {
        Py_ssize_t c = 2 * p + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && less(&h->heap[c + 1], &h->heap[c]))
            c++;
        if (!less(&h->heap[c], &e))
            break;
        place(h, p, h->heap[c]);
        p = c;
    }
    place(h, p, e);
}

static void
resift(LeafHeap *h, Py_ssize_t p)
{
    if (p > 0 && less(&h->heap[p], &h->heap[(p - 1) / 2]))
        sift_up(h, p);
    else
        sift_down(h, p);
}

/* The slot holding ``id``, or -1. */
static Py_ssize_t
find(const LeafHeap *h, uint64_t id)
{
    for (Py_ssize_t i = home(h, id);; i = (i + 1) & h->mask) {
        if (h->slots[i].pos < 0)
            return -1;
        if (h->slots[i].id == id)
            return i;
    }
}

/* Empty slot ``i``, shifting back the entries after it whose probe passed through it. */
static void
slot_remove(LeafHeap *h, Py_ssize_t i)
{
    Py_ssize_t j = i;
    for (;;) {
        j = (j + 1) & h->mask;
        Slot *s = &h->slots[j];
        if (s->pos < 0)
            break;
        Py_ssize_t k = home(h, s->id);
        /* ``s`` stays where it is when its home lies cyclically in (i, j] */
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
            continue;
        h->slots[i] = *s;
        h->heap[s->pos].slot = i;
        i = j;
    }
    h->slots[i].pos = -1;
}

static Slot *
new_slots(Py_ssize_t count)
{
    Slot *s = PyMem_New(Slot, count);
    if (s == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        s[i].pos = -1;
    return s;
}

/* Room for one more entry: the heap's array and an index at most half full after it. */
static int
reserve(LeafHeap *h)
{
    if (h->n == h->cap) {
        Py_ssize_t cap = h->cap * 2;
        /* not PyMem_Resize: it would set h->heap to NULL on failure */
        Entry *heap = PyMem_Realloc(h->heap, (size_t)cap * sizeof(Entry));
        if (heap == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        h->heap = heap;
        h->cap = cap;
    }
    if (2 * (h->n + 1) > h->mask + 1) {
        Py_ssize_t count = 2 * (h->mask + 1);
        Slot *slots = new_slots(count);
        if (slots == NULL)
            return -1;
        PyMem_Free(h->slots);
        h->slots = slots;
        h->mask = count - 1;
        for (Py_ssize_t p = 0; p < h->n; p++) {
            Py_ssize_t i = home(h, h->heap[p].id);
            while (slots[i].pos >= 0)
                i = (i + 1) & h->mask;
            slots[i].id = h->heap[p].id;
            slots[i].pos = p;
            h->heap[p].slot = i;
        }
    }
    return 0;
}

static void
remove_at(LeafHeap *h, Py_ssize_t p)
{
    slot_remove(h, h->heap[p].slot);
    Py_ssize_t last = --h->n;
    if (p != last) {
        place(h, p, h->heap[last]);
        resift(h, p);
    }
}

/* ``obj`` as a uint64 (an id or a tick); TypeError / ValueError naming ``what`` and the value. */
static int
as_u64(PyObject *obj, const char *what, uint64_t *out)
{
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %R", what, obj);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s %R is out of range (0 .. 2**64-1)", what, obj);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

static PyObject *
leafheap_file(LeafHeap *h, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t id, tick;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "file(id, tick) takes 2 arguments, got %zd", nargs);
        return NULL;
    }
    if (as_u64(args[0], "node id", &id) < 0 || as_u64(args[1], "tick", &tick) < 0)
        return NULL;
    if (reserve(h) < 0) /* before the probe: a rehash moves the slots */
        return NULL;
    Py_ssize_t i = home(h, id);
    for (; h->slots[i].pos >= 0; i = (i + 1) & h->mask) {
        if (h->slots[i].id == id) {
            Py_ssize_t p = h->slots[i].pos;
            if (h->heap[p].tick != tick) {
                h->heap[p].tick = tick;
                resift(h, p);
            }
            Py_RETURN_NONE;
        }
    }
    Py_ssize_t p = h->n++;
    h->slots[i].id = id;
    h->slots[i].pos = p;
    h->heap[p] = (Entry){tick, id, i};
    sift_up(h, p);
    Py_RETURN_NONE;
}

static PyObject *
leafheap_discard(LeafHeap *h, PyObject *arg)
{
    uint64_t id;
    if (as_u64(arg, "node id", &id) < 0)
        return NULL;
    Py_ssize_t i = find(h, id);
    if (i >= 0)
        remove_at(h, h->slots[i].pos);
    Py_RETURN_NONE;
}

static PyObject *
leafheap_pop_lru(LeafHeap *h, PyObject *nodes)
{
    if (!PyDict_Check(nodes)) {
        PyErr_Format(PyExc_TypeError, "pop_lru: nodes must be the tree's dict of id -> node, "
                     "got %R", nodes);
        return NULL;
    }
    while (h->n) {
        uint64_t id = h->heap[0].id;
        PyObject *key = PyLong_FromUnsignedLongLong(id);
        if (key == NULL)
            return NULL;
        PyObject *node = PyDict_GetItemWithError(nodes, key);
        Py_DECREF(key);
        if (node == NULL || node == Py_None) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_RuntimeError, "the evictable-leaf heap holds node %llu, "
                             "which is not in the tree", (unsigned long long)id);
            return NULL;
        }
        Py_INCREF(node);
        PyObject *la = PyObject_GetAttr(node, str_last_access);
        uint64_t tick;
        if (la == NULL || as_u64(la, "last_access", &tick) < 0) {
            Py_XDECREF(la);
            Py_DECREF(node);
            return NULL;
        }
        Py_DECREF(la);
        /* the lookup and the attribute read can run Python code (a key's __eq__, a property):
           when that changed the top, start again from the new one */
        if (h->n == 0 || h->heap[0].id != id) {
            Py_DECREF(node);
            continue;
        }
        if (tick != h->heap[0].tick) { /* touched since it was filed: re-filed at its tick now */
            h->heap[0].tick = tick;
            sift_down(h, 0);
            Py_DECREF(node);
            continue;
        }
        remove_at(h, 0);
        return node;
    }
    Py_RETURN_NONE;
}

static PyObject *
leafheap_items(LeafHeap *h, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(h->n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t p = 0; p < h->n; p++) {
        PyObject *t = Py_BuildValue("(KK)", (unsigned long long)h->heap[p].id,
                                    (unsigned long long)h->heap[p].tick);
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, p, t);
    }
    return out;
}

static int
add_violation(PyObject *out, const char *fmt, ...)
{
    va_list va;
    va_start(va, fmt);
    PyObject *s = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (s == NULL)
        return -1;
    int rc = PyList_Append(out, s);
    Py_DECREF(s);
    return rc;
}

static PyObject *
leafheap_violations(LeafHeap *h, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Py_ssize_t occupied = 0;
    for (Py_ssize_t p = 0; p < h->n; p++) {
        const Entry *e = &h->heap[p];
        unsigned long long id = (unsigned long long)e->id;
        if (p > 0 && less(e, &h->heap[(p - 1) / 2])
            && add_violation(out, "node %llu: entry %zd sorts before its parent entry "
                             "(heap order)", id, p) < 0)
            goto fail;
        if ((e->slot < 0 || e->slot > h->mask || h->slots[e->slot].pos != p
             || h->slots[e->slot].id != e->id)
            && add_violation(out, "node %llu: entry %zd and its index slot disagree", id, p) < 0)
            goto fail;
        if (find(h, e->id) != e->slot
            && add_violation(out, "node %llu: not found through the index", id) < 0)
            goto fail;
    }
    for (Py_ssize_t i = 0; i <= h->mask; i++)
        occupied += h->slots[i].pos >= 0;
    if (occupied != h->n
        && add_violation(out, "%zd index slots in use for %zd entries", occupied, h->n) < 0)
        goto fail;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static Py_ssize_t
leafheap_len(LeafHeap *h)
{
    return h->n;
}

static int
leafheap_contains(LeafHeap *h, PyObject *arg)
{
    if (!PyLong_Check(arg) || PyBool_Check(arg))
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(arg);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        return 0; /* no id is out of range */
    }
    return find(h, (uint64_t)v) >= 0;
}

static PyObject *
leafheap_iter(LeafHeap *h)
{
    PyObject *ids = PyList_New(h->n);
    if (ids == NULL)
        return NULL;
    for (Py_ssize_t p = 0; p < h->n; p++) {
        PyObject *id = PyLong_FromUnsignedLongLong(h->heap[p].id);
        if (id == NULL) {
            Py_DECREF(ids);
            return NULL;
        }
        PyList_SET_ITEM(ids, p, id);
    }
    PyObject *it = PyObject_GetIter(ids);
    Py_DECREF(ids);
    return it;
}

static PyObject *
leafheap_repr(LeafHeap *h)
{
    return PyUnicode_FromFormat("LeafHeap(%zd leaves)", h->n);
}

static PyObject *
leafheap_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "LeafHeap() takes no arguments");
        return NULL;
    }
    LeafHeap *h = (LeafHeap *)type->tp_alloc(type, 0);
    if (h == NULL)
        return NULL;
    h->cap = 16;
    h->heap = PyMem_New(Entry, h->cap);
    h->slots = new_slots(32);
    h->mask = 31;
    if (h->heap == NULL || h->slots == NULL) {
        Py_DECREF(h);
        return PyErr_NoMemory();
    }
    return (PyObject *)h;
}

static void
leafheap_dealloc(LeafHeap *h)
{
    PyMem_Free(h->heap);
    PyMem_Free(h->slots);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyMethodDef leafheap_methods[] = {
    {"file", (PyCFunction)(void (*)(void))leafheap_file, METH_FASTCALL,
     "file(id, tick): put id in at tick, or move it there when it is in."},
    {"discard", (PyCFunction)leafheap_discard, METH_O, "discard(id): take id out, if in."},
    {"pop_lru", (PyCFunction)leafheap_pop_lru, METH_O,
     "pop_lru(nodes): take out and return the least recently used leaf's node, or None."},
    {"items", (PyCFunction)leafheap_items, METH_NOARGS, "items(): [(id, tick), ...]."},
    {"violations", (PyCFunction)leafheap_violations, METH_NOARGS,
     "violations(): the broken rules of the heap and its index, as messages."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods leafheap_as_sequence = {
    .sq_length = (lenfunc)leafheap_len,
    .sq_contains = (objobjproc)leafheap_contains,
};

static PyTypeObject LeafHeapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "radixscope.cache._leafheap.LeafHeap",
    .tp_doc = "LeafHeap(): a tier's evictable leaves in LRU order; see cache/leaves.py.",
    .tp_basicsize = sizeof(LeafHeap),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = leafheap_new,
    .tp_dealloc = (destructor)leafheap_dealloc,
    .tp_repr = (reprfunc)leafheap_repr,
    .tp_iter = (getiterfunc)leafheap_iter,
    .tp_as_sequence = &leafheap_as_sequence,
    .tp_methods = leafheap_methods,
};

static struct PyModuleDef leafheap_module = {
    PyModuleDef_HEAD_INIT, "radixscope.cache._leafheap",
    "FULL's evictable leaves as an indexed heap; see cache/leaves.py.", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__leafheap(void)
{
    if (PyType_Ready(&LeafHeapType) < 0)
        return NULL;
    str_last_access = PyUnicode_InternFromString("last_access");
    if (str_last_access == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&leafheap_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI", LEAFHEAP_ABI) < 0
        || PyModule_AddObjectRef(m, "LeafHeap", (PyObject *)&LeafHeapType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
