/* Native kernels of the cache's hot path (``radixscope.cache._native``).

The loops that cost a request most when written as numpy / array calls, each one C pass with no
temporaries: insert's slot guard (``check_split``), the key compare of a descent step
(``common_len``), and the allocator's pop and push (``alloc_pages``, ``free_pages``); and
``untrack``, which takes a tree node's acyclic containers off the garbage collector's lists;
``fill_slots``, which sets a result's slots in one call (the results' ``__init__``).
``cache/native.py`` loads this module and holds the pure-Python versions they must agree with
(tests/cache/test_native.py checks that on random and edge inputs); the cache runs on those when the
module is not built. Every buffer kernel takes buffers (numpy arrays, ``array('Q')``), checks their
item type, length and that no buffer it writes shares memory with another argument, works under the
GIL and never calls back into Python; ``fill_slots`` checks every descriptor before it writes, and a
value it replaces is released (whose finalizer may run) only as it is replaced. ``ABI`` changes
whenever a signature or a result does: ``native.py`` refuses a build whose number is not its own (a
stale ``.so``). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h> /* T_OBJECT_EX, READONLY (Py_T_OBJECT_EX from 3.12) */

#define NATIVE_ABI 4

/* The kinds of buffer the kernels take: 8-byte integers (page and slot ids, token ids), 4- or
   8-byte integers (the free stack), bytes (the bitmaps). */
enum kind { INT64, STACK, BYTES };

typedef struct {
    Py_buffer view;
    int held;
} Buf;

static int
format_ok(const char *fmt, enum kind kind, Py_ssize_t itemsize)
{
    if (fmt == NULL)
        return kind == BYTES;  /* no format: unsigned bytes */
    if (*fmt == '@' || *fmt == '=' || (*fmt == '<' && PY_LITTLE_ENDIAN))
        fmt++;
    if (fmt[0] == '\0' || fmt[1] != '\0')
        return 0;
    switch (kind) {
    case BYTES:
        return itemsize == 1 && strchr("Bb?", fmt[0]) != NULL;
    case INT64:
        return itemsize == 8 && strchr("qQlLnN", fmt[0]) != NULL;
    case STACK:
        return (itemsize == 8 && strchr("qQlLnN", fmt[0]) != NULL)
               || (itemsize == 4 && strchr("iIlL", fmt[0]) != NULL);
    }
    return 0;
}

/* Acquire ``obj`` as a 1-D C-contiguous buffer of ``kind``; TypeError naming ``what`` otherwise. */
static int
acquire(PyObject *obj, Buf *b, enum kind kind, int writable, const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &b->view, flags) < 0)
        return -1;
    b->held = 1;
    if (b->view.ndim > 1 || !format_ok(b->view.format, kind, b->view.itemsize)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a 1-D buffer of %s, got format '%s' "
                     "(itemsize %zd, ndim %d)", what,
                     kind == BYTES ? "bytes" : kind == INT64 ? "64-bit integers"
                                                             : "32- or 64-bit integers",
                     b->view.format ? b->view.format : "B", b->view.itemsize, b->view.ndim);
        return -1;
    }
    return 0;
}

static void
release(Buf *bufs, int n)
{
    for (int i = 0; i < n; i++)
        if (bufs[i].held)
            PyBuffer_Release(&bufs[i].view);
}

static Py_ssize_t
items(const Buf *b)
{
    return b->view.len / b->view.itemsize;
}

/* One argument of a kernel: its kind, whether the kernel writes it, its name in errors. */
typedef struct {
    enum kind kind;
    int writable;
    const char *name;
} Spec;

/* Acquire ``n`` buffers as ``specs`` say; ValueError when a buffer the kernel writes shares
   memory with another argument (its writes could change what was already checked). */
static int
acquire_all(PyObject *const *objs, const Spec *specs, Buf *bufs, int n)
{
    for (int i = 0; i < n; i++)
        if (acquire(objs[i], &bufs[i], specs[i].kind, specs[i].writable, specs[i].name) < 0)
            return -1;
    for (int w = 0; w < n; w++) {
        if (!specs[w].writable || !bufs[w].view.len)
            continue;
        const char *wa = bufs[w].view.buf, *wb = wa + bufs[w].view.len;
        for (int i = 0; i < n; i++) {
            const char *oa = bufs[i].view.buf, *ob = oa + bufs[i].view.len;
            if (i != w && bufs[i].view.len && wa < ob && oa < wb) {
                PyErr_Format(PyExc_ValueError, "%s shares memory with %s", specs[w].name,
                             specs[i].name);
                return -1;
            }
        }
    }
    return 0;
}

PyDoc_STRVAR(check_split_doc,
"check_split(indices, split, used, tree, seen) -> bool\n\n"
"True when every page of ``indices`` (int64) is below ``len(used)``, ``indices[:split]`` are\n"
"all tree-marked (``tree[p] != 0``), and ``indices[split:]`` are all used, not tree-marked and\n"
"distinct. ``seen`` is a zeroed bitmap of at least ``len(used) / 8`` bytes, left zeroed. False\n"
"on the first page that fails (the caller's slow path names it). ValueError for ``split < 0``.\n"
"Reads only.");

static PyObject *
check_split(PyObject *Py_UNUSED(self), PyObject *args)
{
    static const Spec specs[] = {{INT64, 0, "indices"}, {BYTES, 0, "used"}, {BYTES, 0, "tree"},
                                 {BYTES, 1, "seen"}};
    PyObject *o[4];
    Py_ssize_t split;
    Buf b[4];
    PyObject *result = NULL;
    memset(b, 0, sizeof b);
    if (!PyArg_ParseTuple(args, "OnOOO:check_split", &o[0], &split, &o[1], &o[2], &o[3]))
        return NULL;
    if (split < 0) {
        PyErr_Format(PyExc_ValueError, "check_split: split=%zd must be >= 0", split);
        return NULL;
    }
    if (acquire_all(o, specs, b, 4) < 0)
        goto out;
    const Py_ssize_t pages_n = items(&b[1]);
    if (items(&b[2]) != pages_n || items(&b[3]) < (pages_n + 7) / 8) {
        PyErr_Format(PyExc_ValueError, "check_split: %zd used pages, but tree has %zd pages and "
                     "seen %zd bytes (%zd needed)", pages_n, items(&b[2]), items(&b[3]),
                     (pages_n + 7) / 8);
        goto out;
    }
    const uint64_t *idx = (const uint64_t *)b[0].view.buf;
    const uint8_t *used = b[1].view.buf, *tree = b[2].view.buf;
    uint8_t *seen = b[3].view.buf;
    const uint64_t pages = (uint64_t)pages_n;
    const Py_ssize_t n = items(&b[0]);
    if (split > n)
        split = n;
    int ok = 1;
    Py_ssize_t i, marked = split;  /* seen holds the bits of idx[split:marked] */
    for (i = 0; i < n && ok; i++)  /* range first: nothing below indexes out of bounds */
        ok = idx[i] < pages;
    for (i = 0; i < split && ok; i++)
        ok = tree[idx[i]] != 0;
    if (ok) {
        for (i = split; i < n; i++) {
            uint64_t p = idx[i];
            uint8_t bit = (uint8_t)(1u << (p & 7));
            if (tree[p] || !used[p] || (seen[p >> 3] & bit)) {
                ok = 0;
                break;
            }
            seen[p >> 3] |= bit;
        }
        marked = i;
    }
    for (i = split; i < marked; i++)  /* leave the bitmap zeroed */
        seen[idx[i] >> 3] = 0;
    result = PyBool_FromLong(ok);
out:
    release(b, 4);
    return result;
}

PyDoc_STRVAR(common_len_doc,
"common_len(a, a_off, b) -> int\n\n"
"How many leading items of ``a[a_off:]`` and ``b`` are equal (8-byte integers, e.g. two\n"
"``array('Q')``), at most ``min(len(a) - a_off, len(b))``; no copies. ``a_off`` past the end\n"
"gives 0; a negative one raises ValueError.");

static PyObject *
common_len(PyObject *Py_UNUSED(self), PyObject *args)
{
    static const Spec specs[] = {{INT64, 0, "a"}, {INT64, 0, "b"}};
    PyObject *o[2];
    Py_ssize_t off;
    Buf b[2];
    PyObject *result = NULL;
    memset(b, 0, sizeof b);
    if (!PyArg_ParseTuple(args, "OnO:common_len", &o[0], &off, &o[1]))
        return NULL;
    if (off < 0) {
        PyErr_Format(PyExc_ValueError, "common_len: a_off=%zd must be >= 0", off);
        return NULL;
    }
    if (acquire_all(o, specs, b, 2) < 0)
        goto out;
    const Py_ssize_t na = items(&b[0]), nb = items(&b[1]);
    Py_ssize_t n = off >= na ? 0 : na - off;
    if (nb < n)
        n = nb;
    const uint64_t *a = (const uint64_t *)b[0].view.buf + (off < na ? off : 0);
    const uint64_t *c = (const uint64_t *)b[1].view.buf;
    Py_ssize_t k = 0;
    if (n && memcmp(a, c, (size_t)n * 8) == 0) {
        k = n;  /* the common case: the whole node matches */
    } else {
        while (k < n && a[k] == c[k])
            k++;
    }
    result = PyLong_FromSsize_t(k);
out:
    release(b, 2);
    return result;
}

/* The free stack holds int32 page ids while they fit, int64 beyond. */
static inline int64_t
stack_get(const Buf *st, Py_ssize_t i)
{
    return st->view.itemsize == 4 ? ((const int32_t *)st->view.buf)[i]
                                  : ((const int64_t *)st->view.buf)[i];
}

static inline void
stack_set(Buf *st, Py_ssize_t i, uint64_t v)
{
    if (st->view.itemsize == 4)
        ((int32_t *)st->view.buf)[i] = (int32_t)v;
    else
        ((int64_t *)st->view.buf)[i] = (int64_t)v;
}

PyDoc_STRVAR(alloc_pages_doc,
"alloc_pages(stack, top, out, used) -> int | None\n\n"
"Pop ``len(out)`` pages off the free stack ``stack[:top]`` (the top first) into ``out``\n"
"(int64) and mark them used. Returns None, or, leaving the pool unchanged (``out`` is scratch\n"
"then), the first popped page that is already used or out of range (a corrupted allocator).\n"
"ValueError unless ``0 <= len(out) <= top <= len(stack)``.");

static PyObject *
alloc_pages(PyObject *Py_UNUSED(self), PyObject *args)
{
    static const Spec specs[] = {{STACK, 0, "stack"}, {INT64, 1, "out"}, {BYTES, 1, "used"}};
    PyObject *o[3];
    Py_ssize_t top;
    Buf b[3];
    PyObject *result = NULL;
    memset(b, 0, sizeof b);
    if (!PyArg_ParseTuple(args, "OnOO:alloc_pages", &o[0], &top, &o[1], &o[2]))
        return NULL;
    if (acquire_all(o, specs, b, 3) < 0)
        goto out;
    const Py_ssize_t k = items(&b[1]), cap = items(&b[0]);
    if (top < k || top > cap) {
        PyErr_Format(PyExc_ValueError, "alloc_pages: %zd pages asked of a stack of %zd (top %zd)",
                     k, cap, top);
        goto out;
    }
    int64_t *dst = (int64_t *)b[1].view.buf;
    uint8_t *used = b[2].view.buf;
    const uint64_t pages = (uint64_t)items(&b[2]);
    Py_ssize_t i;
    for (i = 0; i < k; i++) {
        int64_t p = stack_get(&b[0], top - 1 - i);
        if ((uint64_t)p >= pages || used[p]) {
            result = PyLong_FromLongLong((long long)p);
            goto out;
        }
        dst[i] = p;
    }
    for (i = 0; i < k; i++)
        used[dst[i]] = 1;
    result = Py_NewRef(Py_None);
out:
    release(b, 3);
    return result;
}

PyDoc_STRVAR(free_pages_doc,
"free_pages(pages, used, tree, stack, top, clear_tree) -> int\n\n"
"Return ``pages`` (int64) to the pool: unmark them used (and tree-owned with ``clear_tree``)\n"
"and push them on the free stack at ``top``, last first, so that the next pops hand them out\n"
"in the order given (a run of pages freed comes back a run). Returns the new top, or,\n"
"changing nothing, -1 when a page is not used (a double free; the caller names it) and -2\n"
"when one is out of range (or past an int32 stack's ids) or the stack has no room for them\n"
"all.");

static PyObject *
free_pages(PyObject *Py_UNUSED(self), PyObject *args)
{
    static const Spec specs[] = {{INT64, 0, "pages"}, {BYTES, 1, "used"}, {BYTES, 1, "tree"},
                                 {STACK, 1, "stack"}};
    PyObject *o[4];
    Py_ssize_t top;
    int clear_tree;
    Buf b[4];
    PyObject *result = NULL;
    memset(b, 0, sizeof b);
    if (!PyArg_ParseTuple(args, "OOOOnp:free_pages", &o[0], &o[1], &o[2], &o[3], &top,
                          &clear_tree))
        return NULL;
    if (acquire_all(o, specs, b, 4) < 0)
        goto out;
    const uint64_t *pg = (const uint64_t *)b[0].view.buf;
    uint8_t *used = b[1].view.buf, *tree = b[2].view.buf;
    const Py_ssize_t n = items(&b[0]), cap = items(&b[3]);
    const uint64_t pages = (uint64_t)items(&b[1]);
    const uint64_t id_max = b[3].view.itemsize == 4 ? (uint64_t)INT32_MAX : (uint64_t)INT64_MAX;
    long long rc = top + n;
    Py_ssize_t i;
    if (top < 0 || top > cap - n || items(&b[2]) != items(&b[1]))
        rc = -2;
    /* Eviction's victims are the least recently used nodes: their pages' bitmap lines are cold
       (one line per 64 pages; a victim's pages lie in runs). Asking for the line of every
       16th page first lets those misses overlap instead of each stalling the loops below. */
#if defined(__GNUC__) || defined(__clang__)
    for (i = 0; i < n; i += 16) {
        if (pg[i] < pages) {
            __builtin_prefetch(used + pg[i], 1, 3);
            if (clear_tree)
                __builtin_prefetch(tree + pg[i], 1, 3);
        }
    }
#endif
    for (i = 0; i < n && rc >= 0; i++)  /* range first: nothing below indexes out of bounds */
        if (pg[i] >= pages || pg[i] > id_max)
            rc = -2;
    for (i = 0; i < n && rc >= 0; i++)
        if (!used[pg[i]])
            rc = -1;
    if (rc >= 0) {
        for (i = 0; i < n; i++) {
            used[pg[i]] = 0;
            if (clear_tree)
                tree[pg[i]] = 0;
            stack_set(&b[3], top + n - 1 - i, pg[i]);
        }
    }
    result = PyLong_FromLongLong(rc);
out:
    release(b, 4);
    return result;
}

PyDoc_STRVAR(untrack_doc,
"untrack(*objs) -> None\n\n"
"Stop the garbage collector tracking each of ``objs`` that it tracks (others are left as they\n"
"are). Only for objects no reference cycle can pass through: a tree node's key, its component\n"
"data and their lists. An untracked object is never scanned, and what it refers to stays\n"
"reachable; a cycle through it would never be collected.");

static PyObject *
untrack(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    for (Py_ssize_t i = 0; i < nargs; i++)
        if (PyObject_IS_GC(args[i]))
            PyObject_GC_UnTrack(args[i]);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(fill_slots_doc,
"fill_slots(obj, slots, *values) -> None\n\n"
"Set each slot of ``obj`` named by ``slots`` (a tuple of its type's member descriptors, as\n"
"``__slots__`` makes them) to the value at the same place, as ``slots[i].__set__(obj, v)``\n"
"would, in one call: a frozen result's ``__init__`` (cache/results.py). Every descriptor and\n"
"the value count are checked before any slot is set.");

static PyObject *
fill_slots(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "fill_slots takes (obj, slots: tuple, *values)");
        return NULL;
    }
    PyObject *obj = args[0], *slots = args[1];
    Py_ssize_t n = PyTuple_GET_SIZE(slots);
    if (nargs - 2 != n) {
        PyErr_Format(PyExc_TypeError, "fill_slots: %zd values for %zd slots", nargs - 2, n);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyTuple_GET_ITEM(slots, i);
        if (!PyObject_TypeCheck(d, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "fill_slots: slots[%zd] is %R, not a member descriptor",
                         i, d);
            return NULL;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)
            || !PyObject_TypeCheck(obj, PyDescr_TYPE(d))) {
            PyErr_Format(PyExc_TypeError, "fill_slots: %R is not a writable object slot of %R",
                         d, Py_TYPE(obj));
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyMemberDef *m = ((PyMemberDescrObject *)PyTuple_GET_ITEM(slots, i))->d_member;
        PyObject **addr = (PyObject **)((char *)obj + m->offset);
        Py_XSETREF(*addr, Py_NewRef(args[2 + i]));
    }
    Py_RETURN_NONE;
}

static PyMethodDef native_methods[] = {
    {"check_split", check_split, METH_VARARGS, check_split_doc},
    {"common_len", common_len, METH_VARARGS, common_len_doc},
    {"alloc_pages", alloc_pages, METH_VARARGS, alloc_pages_doc},
    {"free_pages", free_pages, METH_VARARGS, free_pages_doc},
    {"untrack", (PyCFunction)(void (*)(void))untrack, METH_FASTCALL, untrack_doc},
    {"fill_slots", (PyCFunction)(void (*)(void))fill_slots, METH_FASTCALL, fill_slots_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "radixscope.cache._native",
    "Native kernels of the cache's hot path; see cache/native.py.", -1, native_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    PyObject *m = PyModule_Create(&native_module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", NATIVE_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
