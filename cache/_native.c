/* Native kernels of the cache's hot path (``radixscope.cache._native``).

The loops that cost a request most when written as numpy / array calls, each one C pass with no
temporaries: insert's slot guard (``check_split``), the key compare of a descent step
(``common_len``), and the allocator's pop and push (``alloc_pages``, ``free_pages``). ``cache/native.py`` loads this module and holds the pure-Python versions they
must agree with (tests/cache/test_native.py checks that on random and edge inputs); the cache runs
on those when the module is not built. Both take buffers (numpy arrays, ``array('Q')``), read
them under the GIL and never call back into Python. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* A C-contiguous buffer of ``itemsize``-byte items (any signedness); TypeError otherwise. */
static int
get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable, const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    if (view->itemsize != itemsize || view->ndim > 1) {
        PyErr_Format(PyExc_TypeError, "%s: expected a 1-D buffer of %zd-byte items, got "
                     "itemsize %zd, ndim %d", what, itemsize, view->itemsize, view->ndim);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(check_split_doc,
"check_split(indices, split, used, tree, seen) -> bool\n\n"
"True when every page of ``indices`` (int64) is below ``len(used)``, ``indices[:split]`` are\n"
"all tree-marked (``tree[p] != 0``), and ``indices[split:]`` are all used, not tree-marked and\n"
"distinct. ``seen`` is a zeroed bitmap of at least ``len(used) / 8`` bytes, left zeroed. False\n"
"on the first page that fails (the caller's slow path names it). Reads only.");

static PyObject *
check_split(PyObject *self, PyObject *args)
{
    PyObject *oi, *ou, *ot, *os;
    Py_ssize_t split;
    if (!PyArg_ParseTuple(args, "OnOOO:check_split", &oi, &split, &ou, &ot, &os))
        return NULL;
    Py_buffer bi, bu, bt, bs;
    if (get_buffer(oi, &bi, 8, 0, "indices") < 0)
        return NULL;
    if (get_buffer(ou, &bu, 1, 0, "used") < 0)
        goto fail_i;
    if (get_buffer(ot, &bt, 1, 0, "tree") < 0)
        goto fail_u;
    if (get_buffer(os, &bs, 1, 1, "seen") < 0)
        goto fail_t;
    if (bt.len != bu.len || bs.len * 8 < bu.len) {
        PyErr_Format(PyExc_ValueError, "check_split: tree has %zd pages and seen %zd bits for "
                     "%zd used pages", bt.len, bs.len * 8, bu.len);
        goto fail_s;
    }
    const uint64_t *idx = (const uint64_t *)bi.buf;
    const uint8_t *used = (const uint8_t *)bu.buf, *tree = (const uint8_t *)bt.buf;
    uint8_t *seen = (uint8_t *)bs.buf;
    const uint64_t pages = (uint64_t)bu.len;
    const Py_ssize_t n = bi.len / 8;
    if (split < 0 || split > n)
        split = split < 0 ? 0 : n;
    int ok = 1;
    Py_ssize_t i, j;
    for (i = 0; i < n; i++) {  /* range first: nothing below indexes out of bounds */
        if (idx[i] >= pages) {
            ok = 0;
            goto done;
        }
    }
    for (i = 0; i < split; i++) {
        if (!tree[idx[i]]) {
            ok = 0;
            goto done;
        }
    }
    for (i = split; i < n; i++) {
        uint64_t p = idx[i];
        uint8_t bit = (uint8_t)(1u << (p & 7));
        if (tree[p] || !used[p] || (seen[p >> 3] & bit)) {
            ok = 0;
            break;
        }
        seen[p >> 3] |= bit;
    }
    for (j = split; j < i; j++)  /* leave the bitmap zeroed */
        seen[idx[j] >> 3] = 0;
done:
    PyBuffer_Release(&bs);
    PyBuffer_Release(&bt);
    PyBuffer_Release(&bu);
    PyBuffer_Release(&bi);
    return PyBool_FromLong(ok);
fail_s:
    PyBuffer_Release(&bs);
fail_t:
    PyBuffer_Release(&bt);
fail_u:
    PyBuffer_Release(&bu);
fail_i:
    PyBuffer_Release(&bi);
    return NULL;
}

PyDoc_STRVAR(common_len_doc,
"common_len(a, a_off, b) -> int\n\n"
"How many leading items of ``a[a_off:]`` and ``b`` are equal (8-byte items, e.g. two\n"
"``array('Q')``), at most ``min(len(a) - a_off, len(b))``; no copies. ``a_off`` past the end\n"
"gives 0; a negative one raises ValueError.");

static PyObject *
common_len(PyObject *self, PyObject *args)
{
    PyObject *oa, *ob;
    Py_ssize_t off;
    if (!PyArg_ParseTuple(args, "OnO:common_len", &oa, &off, &ob))
        return NULL;
    if (off < 0) {
        PyErr_Format(PyExc_ValueError, "common_len: a_off=%zd must be >= 0", off);
        return NULL;
    }
    Py_buffer ba, bb;
    if (get_buffer(oa, &ba, 8, 0, "a") < 0)
        return NULL;
    if (get_buffer(ob, &bb, 8, 0, "b") < 0) {
        PyBuffer_Release(&ba);
        return NULL;
    }
    Py_ssize_t na = ba.len / 8, nb = bb.len / 8;
    Py_ssize_t n = off >= na ? 0 : na - off;
    if (nb < n)
        n = nb;
    const uint64_t *a = (const uint64_t *)ba.buf + (off < na ? off : 0);
    const uint64_t *b = (const uint64_t *)bb.buf;
    Py_ssize_t k = 0;
    if (n && memcmp(a, b, (size_t)n * 8) == 0) {
        k = n;  /* the common case: the whole node matches */
    } else {
        while (k < n && a[k] == b[k])
            k++;
    }
    PyBuffer_Release(&bb);
    PyBuffer_Release(&ba);
    return PyLong_FromSsize_t(k);
}

/* The free stack holds int32 page ids while they fit, int64 beyond. */
static inline int64_t
stack_get(const Py_buffer *st, Py_ssize_t i)
{
    return st->itemsize == 4 ? ((const int32_t *)st->buf)[i] : ((const int64_t *)st->buf)[i];
}

static inline void
stack_set(Py_buffer *st, Py_ssize_t i, uint64_t v)
{
    if (st->itemsize == 4)
        ((int32_t *)st->buf)[i] = (int32_t)v;
    else
        ((int64_t *)st->buf)[i] = (int64_t)v;
}

static int
get_stack(PyObject *obj, Py_buffer *view)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return -1;
    if ((view->itemsize != 4 && view->itemsize != 8) || view->ndim > 1) {
        PyErr_Format(PyExc_TypeError, "stack: expected a 1-D buffer of 4- or 8-byte items, got "
                     "itemsize %zd, ndim %d", view->itemsize, view->ndim);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(alloc_pages_doc,
"alloc_pages(stack, top, out, used) -> int | None\n\n"
"Pop ``len(out)`` pages off the free stack ``stack[:top]`` (the top first) into ``out``\n"
"(int64) and mark them used. Returns None, or, changing nothing, the first popped page that\n"
"is already used or out of range (a corrupted allocator). ``len(out) <= top`` or ValueError.");

static PyObject *
alloc_pages(PyObject *self, PyObject *args)
{
    PyObject *ost, *oo, *ou;
    Py_ssize_t top;
    if (!PyArg_ParseTuple(args, "OnOO:alloc_pages", &ost, &top, &oo, &ou))
        return NULL;
    Py_buffer bst, bo, bu;
    if (get_stack(ost, &bst) < 0)
        return NULL;
    if (get_buffer(oo, &bo, 8, 1, "out") < 0)
        goto fail_st;
    if (get_buffer(ou, &bu, 1, 1, "used") < 0)
        goto fail_o;
    const Py_ssize_t k = bo.len / 8, cap = bst.len / bst.itemsize;
    if (top < k || top > cap) {
        PyErr_Format(PyExc_ValueError, "alloc_pages: %zd pages asked of a stack of %zd (top %zd)",
                     k, cap, top);
        goto fail_u;
    }
    int64_t *out = (int64_t *)bo.buf;
    uint8_t *used = (uint8_t *)bu.buf;
    const uint64_t pages = (uint64_t)bu.len;
    int64_t bad = 0;
    int ok = 1;
    Py_ssize_t i;
    for (i = 0; i < k; i++) {
        int64_t p = stack_get(&bst, top - 1 - i);
        if ((uint64_t)p >= pages || used[p]) {
            bad = p;
            ok = 0;
            break;
        }
        out[i] = p;
    }
    if (ok)
        for (i = 0; i < k; i++)
            used[out[i]] = 1;
    PyBuffer_Release(&bu);
    PyBuffer_Release(&bo);
    PyBuffer_Release(&bst);
    if (ok)
        Py_RETURN_NONE;
    return PyLong_FromLongLong((long long)bad);
fail_u:
    PyBuffer_Release(&bu);
fail_o:
    PyBuffer_Release(&bo);
fail_st:
    PyBuffer_Release(&bst);
    return NULL;
}

PyDoc_STRVAR(free_pages_doc,
"free_pages(pages, used, tree, stack, top, clear_tree) -> int\n\n"
"Return ``pages`` (int64) to the pool: unmark them used (and tree-owned with ``clear_tree``)\n"
"and push them on the free stack at ``top``. Returns the new top, or, changing nothing, -1\n"
"when a page is not used (a double free; the caller names it) and -2 when one is out of range\n"
"or the stack has no room for them all.");

static PyObject *
free_pages(PyObject *self, PyObject *args)
{
    PyObject *op, *ou, *ot, *ost;
    Py_ssize_t top;
    int clear_tree;
    if (!PyArg_ParseTuple(args, "OOOOnp:free_pages", &op, &ou, &ot, &ost, &top, &clear_tree))
        return NULL;
    Py_buffer bp, bu, bt, bst;
    if (get_buffer(op, &bp, 8, 0, "pages") < 0)
        return NULL;
    if (get_buffer(ou, &bu, 1, 1, "used") < 0)
        goto fail_p;
    if (get_buffer(ot, &bt, 1, 1, "tree") < 0)
        goto fail_u;
    if (get_stack(ost, &bst) < 0)
        goto fail_t;
    const uint64_t *pg = (const uint64_t *)bp.buf;
    uint8_t *used = (uint8_t *)bu.buf, *tree = (uint8_t *)bt.buf;
    const Py_ssize_t n = bp.len / 8, cap = bst.len / bst.itemsize;
    const uint64_t pages = (uint64_t)bu.len;
    long long out = top;
    Py_ssize_t i;
    if (top < 0 || top > cap - n || bt.len != bu.len) {
        out = -2;
        goto done;
    }
    for (i = 0; i < n; i++) {  /* range first: nothing below indexes out of bounds */
        if (pg[i] >= pages) {
            out = -2;
            goto done;
        }
    }
    for (i = 0; i < n; i++) {
        if (!used[pg[i]]) {
            out = -1;
            goto done;
        }
    }
    for (i = 0; i < n; i++) {
        used[pg[i]] = 0;
        if (clear_tree)
            tree[pg[i]] = 0;
        stack_set(&bst, top + i, pg[i]);
    }
    out = top + n;
done:
    PyBuffer_Release(&bst);
    PyBuffer_Release(&bt);
    PyBuffer_Release(&bu);
    PyBuffer_Release(&bp);
    return PyLong_FromLongLong(out);
fail_t:
    PyBuffer_Release(&bt);
fail_u:
    PyBuffer_Release(&bu);
fail_p:
    PyBuffer_Release(&bp);
    return NULL;
}

static PyMethodDef native_methods[] = {
    {"check_split", check_split, METH_VARARGS, check_split_doc},
    {"common_len", common_len, METH_VARARGS, common_len_doc},
    {"alloc_pages", alloc_pages, METH_VARARGS, alloc_pages_doc},
    {"free_pages", free_pages, METH_VARARGS, free_pages_doc},
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
    return PyModule_Create(&native_module);
}
