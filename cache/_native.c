/* Native kernels of the cache's hot path (``radixscope.cache._native``).

The loops that cost a request most when written as numpy / array calls, each one C pass with no
temporaries: insert's slot guard (``check_split``), the key compare of a descent step
(``common_len``), and the allocator's pop and push (``alloc_pages``, ``free_pages``); and
``untrack``, which takes a tree node's acyclic containers off the garbage collector's lists;
``fill_slots``, which sets a result's slots in one call (the results' ``__init__``); and
``Fields``, a recorded op's attribute builder made from a declarative spec (cache/op_attrs.py),
which reads the result's slots by offset and builds the tuple with no Python frame.
``cache/native.py`` loads this module and holds the pure-Python versions they must agree with
(tests/cache/test_native.py checks that on random and edge inputs); the cache runs on those when the
module is not built. Every buffer kernel takes buffers (numpy arrays, ``array('Q')``), checks their
item type, length and that no buffer it writes shares memory with another argument, works under the
GIL and never calls back into Python; ``fill_slots`` checks every descriptor before it writes, and a
value it replaces is released (whose finalizer may run) only as it is replaced; ``Fields``
reads what the Python expressions it stands for would, their errors included. ``ABI`` changes
whenever a signature or a result does: ``native.py`` refuses a build whose number is not its own (a
stale ``.so``). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h> /* T_OBJECT_EX, READONLY (Py_T_OBJECT_EX from 3.12) */

#include "_builders.h"
#include "_slots.h" /* slot_get: Fields' reads of a result's slots */

#define NATIVE_ABI 5

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

/* ---- Fields: a recorded op's attributes, read off its result ------------------------------ */

/* What an item of a spec reads (``cache/native.py`` names them: ``OUT``, ``ARG``, ``GET``) and
   what it makes of the value (``OR_NONE``, ``LEN``, ``DICT``; ``AS_IS``: the value itself). */
enum src { SRC_OUT, SRC_ARG, SRC_GET };
enum how { AS_IS, OR_NONE, LEN, DICT };

typedef struct {
    enum src src;
    enum how how;
    PyObject *key;    /* OUT: the attribute's name (interned); ARG: the index (an int) */
    Py_ssize_t index; /* ARG: the index; GET: the item holding the mapping */
    Py_ssize_t kitem; /* GET: the item holding the key */
    PyObject *dflt;   /* GET: the value where the key is missing */
    slot_hint hint;   /* OUT: where the result's type keeps the attribute */
} Item;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_ssize_t n;
    Item *items;
    int gets;           /* some items are GET items */
    PyObject *spec;     /* the spec as given (``spec``; NULL once cleared) */
    PyObject *type;     /* the result's exact type, or NULL: any */
    PyObject *fallback; /* called for a result of another type, or NULL: TypeError */
} Fields;

/* ``dict(pairs)``: a tuple of 2-tuples (a result's per-component counts) directly, anything
   else through ``dict`` itself (its errors, its mapping case). */
static PyObject *
as_dict(PyObject *x)
{
    if (PyTuple_CheckExact(x)) {
        Py_ssize_t n = PyTuple_GET_SIZE(x), i;
        for (i = 0; i < n; i++) {
            PyObject *p = PyTuple_GET_ITEM(x, i);
            if (!PyTuple_CheckExact(p) || PyTuple_GET_SIZE(p) != 2)
                break;
        }
        if (i == n) {
            PyObject *d = PyDict_New();
            for (i = 0; d != NULL && i < n; i++) {
                PyObject *p = PyTuple_GET_ITEM(x, i); /* ``x`` holds it: a key's __hash__ or
                                                         __eq__ cannot free it */
                if (PyDict_SetItem(d, PyTuple_GET_ITEM(p, 0), PyTuple_GET_ITEM(p, 1)) < 0)
                    Py_CLEAR(d);
            }
            return d;
        }
    }
    return PyObject_CallOneArg((PyObject *)&PyDict_Type, x);
}

/* ``tuple(args[0..n])``: a new reference, or NULL. */
static PyObject *
tuple_of(PyObject *const *args, Py_ssize_t n)
{
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t != NULL && i < n; i++)
        PyTuple_SET_ITEM(t, i, Py_NewRef(args[i]));
    return t;
}

/* ``args[i]`` of the op's arguments: the vector ``argv`` (``argc`` of them) when ``argt`` is
   NULL, else ``argt`` as the builder was called with it. A new reference, or NULL with the
   error ``args[i]`` raises (from a tuple made of the vector where ``i`` is past its end). */
static PyObject *
arg_value(const Item *it, PyObject *const *argv, Py_ssize_t argc, PyObject *argt)
{
    if (argt == NULL) {
        if (it->index < argc)
            return Py_NewRef(argv[it->index]);
        PyObject *t = tuple_of(argv, argc), *v = NULL;
        if (t != NULL) {
            v = PyObject_GetItem(t, it->key); /* IndexError, as the tuple the call would make */
            Py_DECREF(t);
        }
        return v;
    }
    if (PyTuple_CheckExact(argt) && it->index < PyTuple_GET_SIZE(argt))
        return Py_NewRef(PyTuple_GET_ITEM(argt, it->index));
    return PyObject_GetItem(argt, it->key); /* ``args[i]``, its errors */
}

/* One OUT or ARG item's value (a new reference), or NULL. */
static PyObject *
item_value(Item *it, PyObject *out, PyObject *const *argv, Py_ssize_t argc, PyObject *argt)
{
    PyObject *v = it->src == SRC_OUT ? slot_get(out, it->key, &it->hint)
                                     : arg_value(it, argv, argc, argt);
    if (v == NULL || it->how == AS_IS)
        return v;
    PyObject *r = NULL;
    if (it->how == OR_NONE) {
        int t = PyObject_IsTrue(v);
        r = t < 0 ? NULL : Py_NewRef(t ? v : Py_None);
    } else if (it->how == LEN) {
        Py_ssize_t k = PyObject_Length(v);
        r = k < 0 ? NULL : PyLong_FromSsize_t(k);
    } else {
        r = as_dict(v);
    }
    Py_DECREF(v);
    return r;
}

/* ``vals[kitem]`` looked up in ``vals[index]`` (``.get(key, dflt)``), a new reference. */
static PyObject *
get_value(const Item *it, PyObject *const *vals)
{
    PyObject *map = vals[it->index], *key = vals[it->kitem];
    if (!PyDict_CheckExact(map))
        return PyObject_CallMethod(map, "get", "OO", key, it->dflt);
    PyObject *v = PyDict_GetItemWithError(map, key); /* borrowed; taken before anything runs */
    if (v == NULL && PyErr_Occurred())
        return NULL;
    return Py_NewRef(v != NULL ? v : it->dflt);
}

/* The builder's call with the op's arguments as the vector ``argv`` (``argc`` of them; then
   ``argt`` is NULL) or as the object ``argt`` it was called with. */
static PyObject *
fields_build(Fields *F, PyObject *cache, PyObject *out, PyObject *const *argv,
             Py_ssize_t argc, PyObject *argt)
{
    if (F->spec == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Fields: called after the collector cleared it");
        return NULL;
    }
    if (F->type != NULL && (PyObject *)Py_TYPE(out) != F->type) {
        if (F->fallback == NULL) {
            PyErr_Format(PyExc_TypeError, "Fields: expected a result of type %s, got %s",
                         ((PyTypeObject *)F->type)->tp_name, Py_TYPE(out)->tp_name);
            return NULL;
        }
        PyObject *t = argt != NULL ? Py_NewRef(argt) : tuple_of(argv, argc), *r = NULL;
        if (t != NULL) {
            PyObject *fargs[3] = {cache, out, t};
            r = PyObject_Vectorcall(F->fallback, fargs, 3, NULL);
            Py_DECREF(t);
        }
        return r;
    }
    /* Filled in place, off the collector's lists meanwhile: a getattr or a __bool__ may run
       Python code, which could otherwise find the half-filled tuple (``gc.get_objects()``); a
       NULL item is fine to its dealloc on an error. GET items after the others: they read
       them. */
    PyObject *t = PyTuple_New(F->n);
    if (t == NULL)
        return NULL;
    PyObject_GC_UnTrack(t);
    PyObject **vals = ((PyTupleObject *)t)->ob_item;
    Item *items = F->items;
    const Py_ssize_t n = F->n;
    Py_ssize_t i;
    for (i = 0; i < n; i++)
        if (items[i].src != SRC_GET
            && (vals[i] = item_value(&items[i], out, argv, argc, argt)) == NULL)
            goto fail;
    for (i = 0; F->gets && i < n; i++)
        if (items[i].src == SRC_GET && (vals[i] = get_value(&items[i], vals)) == NULL)
            goto fail;
    PyObject_GC_Track(t);
    return t;
fail:
    Py_DECREF(t);
    return NULL;
}

static PyObject *
fields_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 3 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_Format(PyExc_TypeError, "Fields takes (cache, out, args), got %zd positional "
                     "and %zd keyword arguments", nargs,
                     kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : (Py_ssize_t)0);
        return NULL;
    }
    return fields_build((Fields *)self, args[0], args[1], NULL, 0, args[2]);
}

static PyTypeObject FieldsType;

/* The ledger's entry (cache/_builders.h): the call with the arguments as a vector. */
static PyObject *
fields_build_api(PyObject *self, PyObject *cache, PyObject *out, PyObject *const *args,
                 Py_ssize_t n)
{
    if (Py_TYPE(self) == &FieldsType)
        return fields_build((Fields *)self, cache, out, args, n, NULL);
    /* another type that carries the capsule (copied onto it): the call itself */
    PyObject *t = tuple_of(args, n), *r = NULL;
    if (t != NULL) {
        r = PyObject_CallFunctionObjArgs(self, cache, out, t, NULL);
        Py_DECREF(t);
    }
    return r;
}

static const rs_builder_api BUILDER_API = {RS_BUILDERS_VERSION, fields_build_api};

/* An error about ``spec[i]``, naming it. */
static int
bad_item(PyObject *exc, Py_ssize_t i, PyObject *item, const char *why)
{
    PyErr_Format(exc, "Fields: spec[%zd] is %R: %s", i, item, why);
    return -1;
}

/* ``it`` made from ``spec[i]`` (``Fields``'s doc says what an item may be); -1 with the error
   naming the item. */
static int
parse_item(Item *it, PyObject *spec, Py_ssize_t i)
{
    static const char *const srcs[] = {"out", "arg", "get"};
    static const char *const hows[] = {"or None", "len", "dict"};
    PyObject *item = PyTuple_GET_ITEM(spec, i);
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 2)
        return bad_item(PyExc_TypeError, i, item, "an item is a tuple (source, key[, how])");
    Py_ssize_t size = PyTuple_GET_SIZE(item), s;
    PyObject *src = PyTuple_GET_ITEM(item, 0), *key = PyTuple_GET_ITEM(item, 1);
    for (s = 0; s < 3; s++)
        if (PyUnicode_Check(src) && PyUnicode_CompareWithASCIIString(src, srcs[s]) == 0)
            break;
    if (s == 3)
        return bad_item(PyExc_ValueError, i, item, "its source is not 'out', 'arg' or 'get'");
    it->src = (enum src)s;
    if (it->src == SRC_GET) {
        if (size != 4)
            return bad_item(PyExc_TypeError, i, item, "a 'get' item is ('get', mapping item, "
                            "key item, default)");
        PyObject *k = PyTuple_GET_ITEM(item, 2);
        it->index = PyLong_Check(key) && !PyBool_Check(key) ? PyLong_AsSsize_t(key) : -1;
        it->kitem = PyLong_Check(k) && !PyBool_Check(k) ? PyLong_AsSsize_t(k) : -1;
        if (PyErr_Occurred())
            PyErr_Clear(); /* an int past Py_ssize_t: out of range below */
        it->dflt = Py_NewRef(PyTuple_GET_ITEM(item, 3));
        return 0; /* the items named are checked once all are parsed */
    }
    if (size > 3)
        return bad_item(PyExc_TypeError, i, item, "an item is a tuple (source, key[, how])");
    PyObject *how = size == 3 ? PyTuple_GET_ITEM(item, 2) : Py_None;
    if (how != Py_None) {
        for (s = 0; s < 3; s++)
            if (PyUnicode_Check(how) && PyUnicode_CompareWithASCIIString(how, hows[s]) == 0)
                break;
        if (s == 3)
            return bad_item(PyExc_ValueError, i, item, "its how is not None, 'or None', 'len' "
                            "or 'dict'");
        it->how = (enum how)(s + 1);
    }
    if (it->src == SRC_OUT) {
        if (!PyUnicode_CheckExact(key))
            return bad_item(PyExc_TypeError, i, item, "an 'out' item names an attribute (a str)");
        it->key = Py_NewRef(key);
        PyUnicode_InternInPlace(&it->key);
        return 0;
    }
    it->index = PyLong_Check(key) && !PyBool_Check(key) ? PyLong_AsSsize_t(key) : -1;
    if (it->index < 0) {
        PyErr_Clear();
        return bad_item(PyExc_ValueError, i, item, "an 'arg' item's key is an index >= 0");
    }
    it->key = Py_NewRef(key);
    return 0;
}

static int fields_clear(PyObject *self);

static PyObject *
fields_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"spec", "type", "fallback", NULL};
    PyObject *spec, *tp = Py_None, *fallback = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$OO:Fields", kw, &spec, &tp, &fallback))
        return NULL;
    if (!PyTuple_Check(spec)) {
        PyErr_Format(PyExc_TypeError, "Fields: spec must be a tuple of items, got %R", spec);
        return NULL;
    }
    if (PyTuple_GET_SIZE(spec) == 0) { /* (its tuple would be the shared empty one, which the
                                          call must not untrack and track) */
        PyErr_SetString(PyExc_ValueError, "Fields: spec has no items");
        return NULL;
    }
    if (tp != Py_None && !PyType_Check(tp)) {
        PyErr_Format(PyExc_TypeError, "Fields: type must be a type or None, got %R", tp);
        return NULL;
    }
    if (fallback != Py_None && (tp == Py_None || !PyCallable_Check(fallback))) {
        PyErr_Format(PyExc_TypeError, "Fields: fallback must be callable and comes with a type "
                     "(it builds a result of another type), got %R", fallback);
        return NULL;
    }
    Fields *F = PyObject_GC_New(Fields, type);
    if (F == NULL)
        return NULL;
    F->vectorcall = fields_vectorcall;
    F->n = PyTuple_GET_SIZE(spec);
    F->gets = 0;
    F->spec = Py_NewRef(spec);
    F->type = tp == Py_None ? NULL : Py_NewRef(tp);
    F->fallback = fallback == Py_None ? NULL : Py_NewRef(fallback);
    F->items = PyMem_Calloc(F->n ? (size_t)F->n : 1, sizeof(Item)); /* keys and defaults NULL */
    PyObject_GC_Track(F);
    if (F->items == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < F->n; i++)
        if (parse_item(&F->items[i], spec, i) < 0)
            goto fail;
    for (Py_ssize_t i = 0; i < F->n; i++) {
        const Item *it = &F->items[i];
        F->gets |= it->src == SRC_GET;
        if (it->src == SRC_GET
            && (it->index < 0 || it->index >= F->n || F->items[it->index].src == SRC_GET
                || it->kitem < 0 || it->kitem >= F->n || F->items[it->kitem].src == SRC_GET)) {
            bad_item(PyExc_ValueError, i, PyTuple_GET_ITEM(spec, i), "a 'get' item names two "
                     "other items by position, neither a 'get' item");
            goto fail;
        }
    }
    return (PyObject *)F;
fail:
    Py_DECREF(F);
    return NULL;
}

static int
fields_traverse(PyObject *self, visitproc visit, void *arg)
{
    Fields *F = (Fields *)self;
    Py_VISIT(F->spec);
    Py_VISIT(F->type);
    Py_VISIT(F->fallback);
    for (Py_ssize_t i = 0; F->items != NULL && i < F->n; i++)
        Py_VISIT(F->items[i].dflt); /* keys are strs and ints: no cycle runs through one */
    return 0;
}

static int
fields_clear(PyObject *self)
{
    Fields *F = (Fields *)self;
    Py_CLEAR(F->spec); /* a call from now on raises */
    Py_CLEAR(F->type);
    Py_CLEAR(F->fallback);
    for (Py_ssize_t i = 0; F->items != NULL && i < F->n; i++)
        Py_CLEAR(F->items[i].dflt);
    return 0;
}

static void
fields_dealloc(PyObject *self)
{
    Fields *F = (Fields *)self;
    PyObject_GC_UnTrack(self);
    fields_clear(self);
    for (Py_ssize_t i = 0; F->items != NULL && i < F->n; i++)
        Py_CLEAR(F->items[i].key);
    PyMem_Free(F->items);
    PyObject_GC_Del(self);
}

static PyObject *
fields_repr(PyObject *self)
{
    Fields *F = (Fields *)self;
    return PyUnicode_FromFormat("Fields(%R, type=%R, fallback=%R)",
                                F->spec ? F->spec : Py_None, F->type ? F->type : Py_None,
                                F->fallback ? F->fallback : Py_None);
}

static PyMemberDef fields_members[] = {
    {"spec", T_OBJECT, offsetof(Fields, spec), READONLY, "the spec as given"},
    {"type", T_OBJECT, offsetof(Fields, type), READONLY, "the result type it reads, or None"},
    {"fallback", T_OBJECT, offsetof(Fields, fallback), READONLY,
     "what builds a result of another type, or None"},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(fields_doc,
"Fields(spec, *, type=None, fallback=None)\n\n"
"A recorded op's attribute builder made from a declarative spec: called as\n"
"``f(cache, out, args)`` (the ledger's ``attrs[op]``) it returns a tuple with one value per\n"
"item of ``spec``, each one of:\n\n"
"- ``('out', name[, how])``: ``out.name``, read by offset where ``out``'s type keeps it in a\n"
"  ``__slots__`` slot (learned once per type, guarded by the type's version tag), through\n"
"  ``getattr`` otherwise;\n"
"- ``('arg', i[, how])``: ``args[i]``;\n"
"- ``('get', m, k, default)``: ``value[m].get(value[k], default)``, the values of two other\n"
"  items (neither a ``get`` item);\n\n"
"where ``how`` is None (the value), ``'or None'`` (``v or None``), ``'len'`` (``len(v)``) or\n"
"``'dict'`` (``dict(v)``). With ``type``, a result whose type is not exactly ``type`` goes to\n"
"``fallback(cache, out, args)`` (TypeError without one). Errors propagate as the Python\n"
"expression's would; a bad spec raises TypeError or ValueError naming the item.");

static PyTypeObject FieldsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "radixscope.cache._native.Fields",
    .tp_basicsize = sizeof(Fields),
    .tp_dealloc = fields_dealloc,
    .tp_vectorcall_offset = offsetof(Fields, vectorcall),
    .tp_repr = fields_repr,
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = fields_doc,
    .tp_traverse = fields_traverse,
    .tp_clear = fields_clear,
    .tp_members = fields_members,
    .tp_new = fields_new,
};

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
    if (PyType_Ready(&FieldsType) < 0)
        return NULL;
    /* the ledger's entry, on the type (cache/_builders.h) */
    PyObject *cap = PyCapsule_New((void *)&BUILDER_API, RS_BUILDERS_CAPSULE, NULL);
    if (cap == NULL)
        return NULL;
    int r = PyDict_SetItemString(FieldsType.tp_dict, RS_BUILDERS_ATTR, cap);
    Py_DECREF(cap);
    if (r < 0)
        return NULL;
    PyType_Modified(&FieldsType);
    PyObject *m = PyModule_Create(&native_module);
    if (m != NULL && (PyModule_AddIntConstant(m, "ABI", NATIVE_ABI) < 0
                      || PyModule_AddObject(m, "Fields", Py_NewRef(&FieldsType)) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
