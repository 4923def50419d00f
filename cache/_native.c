/* Native kernels of the cache's hot path (``radixscope.cache._native``).

Two loops that cost a request most when written as numpy / array calls, each one C pass with no
temporaries: insert's slot guard (``check_split``) and the key compare of a descent step
(``common_len``). ``cache/native.py`` loads this module and holds the pure-Python versions they
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

static PyMethodDef native_methods[] = {
    {"check_split", check_split, METH_VARARGS, check_split_doc},
    {"common_len", common_len, METH_VARARGS, common_len_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "radixscope.cache._native",
    "Native kernels of the cache's hot path; see cache/native.py.", -1, native_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModule_Create(&native_module);
}
