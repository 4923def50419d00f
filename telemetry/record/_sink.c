/* The recorder's hot path in C (``radixscope.telemetry.record._sink``).

A ``Sink`` is what the cache calls once per op, ``sink(op, mutations)``: it reduces the op's
caller context to its parent span's ids (remembering the last context, as ``compact_record``
does, and those ids' encoding: ``put_parent``), and appends the compact record ``(op_id, op,
start_ns, end_ns, req_id, parent, seq_first, seq_last, attrs, error, mutations)`` to one growing
buffer, encoded exactly as ``marshal.dumps(record, 2)`` encodes it, so the sinks' decoding
(``marshal.loads``) is unchanged.
None, bools, exact ints, strs, tuples, lists, dicts of those plain values (an eviction's freed
slots) and buffers (a created node's tokens) are written here; any other value (a float, a dict
holding anything else) is handed to marshal's own writer and spliced in
(version 2 has no back-references, so encodings concatenate). No Python object is made per
record.

Everything but the common case goes back to Python, to the recorder's own methods:

- ``full(op, mutations)`` when ``n`` (records buffered) has reached ``limit`` (the recorder
  seals the buffer, or applies its overflow policy);
- ``fallback(op, mutations)`` when the record is not a 10-tuple, or a value cannot be encoded
  here or by marshal (the recorder's pure-Python path pickles it, or counts it as lost);
- ``parent_of(context)`` for a context not seen last: its span's ids, a 4-tuple.

Nothing is written before ``parent_of`` returns, and a failed encode leaves the buffer as it was.
The drain thread takes a batch with ``take_batch`` (the records as one marshal list): past
64 KB the sink swaps to a spare buffer and the batch is copied with the GIL released (so the
sink holds two buffers of a batch's size, both mapped, of at most 16 MB after a burst; see
``sink_take_batch``; ``capacity`` gives their sizes).

Python code can run while a record is half written (marshal's writer sorts a set's items, which
may run a collection and so finalizers; on Python 3.12+ a buffer may be Python's): ``take`` and
``peek`` return whole records only and keep the one being written, a call made meanwhile goes to
``fallback``, and a list is re-checked item by item. ``SINK_ABI`` changes whenever the
interface does: ``telemetry/record/sink.py`` refuses a build whose number is not its own.

The cache's native ledger calls the sink without making the record's objects, through the C
table ``cache/_direct.h`` defines and this module puts on ``Sink`` (a capsule in
``Sink._radixscope_direct_api``): ``direct_mutation`` writes one mutation into the ledger's own
buffer where that runs no Python code (``encode_plain``: None, bools, ints of 64 bits, strs,
bytes, ``array.array`` and exact tuples, lists and dicts of those), and ``direct_record``
appends a record from its fields and those bytes, with ``sink_vectorcall``'s checks: whatever
that would send to ``full`` or ``fallback`` (at the limit, busy, not encodable) is handed back to
the ledger, which then calls the sink with the objects. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <marshal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../../cache/_direct.h"

#define SINK_ABI 3
#define MARSHAL_VERSION 2
#define MAX_DEPTH 64 /* deeper values go to marshal's writer, which has its own limit */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    rs_bytes out;     /* the records */
    Py_ssize_t done;  /* bytes of whole records: == len unless a record is being written */
    Py_ssize_t n;     /* records in buf */
    int busy;         /* a record is being written: see ``append`` */
    Py_ssize_t limit; /* records allowed in buf before ``full`` is called */
    long long recorded_seq;
    char *spare;      /* the buffer ``take_batch`` copied from last, kept for the next swap */
    Py_ssize_t spare_cap;
    int taking;       /* a ``take_batch`` copies with the GIL released: the spare is its */
    PyObject *full, *fallback, *parent_of;
    PyObject *last_ctx, *last_parent; /* the context seen last and its span's ids */
    PyObject *parent_encoded; /* the span's ids whose encoding ``parent_enc`` holds (held) */
    rs_bytes parent_enc;      /* see ``put_parent`` */
} Sink;

/* ---- the buffer ------------------------------------------------------------------------- */

/* ``reserve``'s slow case: the buffer doubled until ``more`` bytes fit past its end. */
static int
grow(rs_bytes *s, Py_ssize_t more)
{
    Py_ssize_t cap = s->cap ? s->cap : 4096;
    while (cap - s->len < more) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *p = PyMem_Realloc(s->buf, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->buf = p;
    s->cap = cap;
    return 0;
}

/* Room for ``more`` bytes past the end: a compare where there is (inline, as every writer
   below calls it), ``grow`` where there is not. */
static inline int
reserve(rs_bytes *s, Py_ssize_t more)
{
    return s->cap - s->len >= more ? 0 : grow(s, more);
}

/* The unchecked writers: each writes at ``p``, in room a ``reserve`` made, and returns the end
   of what it wrote; the caller then sets ``len`` from it. A run of fields of bounded size takes
   one ``reserve``. No Python code may run between the ``reserve`` and the writes (it could
   move the buffer: ``take`` while a record is being written). */
static inline unsigned char *
end_of(rs_bytes *s)
{
    return (unsigned char *)s->buf + s->len;
}

/* ``type`` and ``v`` as 4 bytes, little-endian (one store where the machine is) */
static inline unsigned char *
w_type_int32(unsigned char *p, char type, int32_t v)
{
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)type;
#if PY_LITTLE_ENDIAN
    memcpy(p + 1, &u, 4);
#else
    p[1] = (unsigned char)(u & 0xff);
    p[2] = (unsigned char)((u >> 8) & 0xff);
    p[3] = (unsigned char)((u >> 16) & 0xff);
    p[4] = (unsigned char)((u >> 24) & 0xff);
#endif
    return p + 5;
}

/* The bits of ``m`` (0 for 0). */
static inline int
bit_length(unsigned long long m)
{
#if defined(__GNUC__) || defined(__clang__)
    return m ? 64 - __builtin_clzll(m) : 0;
#else
    int n = 0;
    for (; m; m >>= 1)
        n++;
    return n;
#endif
}

/* marshal's TYPE_LONG: the magnitude in 15-bit digits, least significant first, their count
   signed by the value's sign. 64 bits are at most 5 digits: LONG64_ROOM bytes in all. (All 5
   written, unrolled, the end put after the last used, measured no cheaper.) */
#define LONG64_ROOM (5 + 2 * 5)

static inline unsigned char *
w_long64(unsigned char *p, long long x)
{
    unsigned long long mag = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
    int32_t digits = (bit_length(mag) + 14) / 15;
    p = w_type_int32(p, 'l', x < 0 ? -digits : digits);
    for (int32_t i = 0; i < digits; i++, mag >>= 15, p += 2) {
        p[0] = (unsigned char)(mag & 0xff);
        p[1] = (unsigned char)((mag >> 8) & 0x7f);
    }
    return p;
}

/* An int of 64 bits as marshal writes it: TYPE_INT where it fits in 32, else TYPE_LONG. */
static inline unsigned char *
w_ll(unsigned char *p, long long x)
{
    if (x >= INT32_MIN && x <= INT32_MAX)
        return w_type_int32(p, 'i', (int32_t)x);
    return w_long64(p, x);
}

static inline int
put(rs_bytes *s, const void *data, Py_ssize_t size)
{
    if (reserve(s, size) < 0)
        return -1;
    memcpy(s->buf + s->len, data, (size_t)size);
    s->len += size;
    return 0;
}

static inline int
put1(rs_bytes *s, char c)
{
    if (reserve(s, 1) < 0)
        return -1;
    s->buf[s->len++] = c;
    return 0;
}

static inline int
put_type_int32(rs_bytes *s, char type, int32_t v)
{
    if (reserve(s, 5) < 0)
        return -1;
    w_type_int32(end_of(s), type, v);
    s->len += 5;
    return 0;
}

static inline int
put_ll(rs_bytes *s, long long x)
{
    if (reserve(s, LONG64_ROOM) < 0)
        return -1;
    s->len = (char *)w_ll(end_of(s), x) - s->buf;
    return 0;
}

/* Two of them, in one ``reserve`` (a record's start and end, its first and last seq). */
static inline int
put_ll2(rs_bytes *s, long long x, long long y)
{
    if (reserve(s, 2 * LONG64_ROOM) < 0)
        return -1;
    s->len = (char *)w_ll(w_ll(end_of(s), x), y) - s->buf;
    return 0;
}

/* ``type``, a 4-byte size and ``size`` bytes (a str's UTF-8, a buffer's bytes). */
static inline int
put_sized(rs_bytes *s, char type, const void *data, Py_ssize_t size)
{
    if (reserve(s, 5 + size) < 0)
        return -1;
    unsigned char *p = w_type_int32(end_of(s), type, (int32_t)size);
    memcpy(p, data, (size_t)size);
    s->len += 5 + size;
    return 0;
}

/* ---- marshal version 2, the common types -------------------------------------------------- */

/* An int of at most one digit (most ids, counts and lengths): its value read straight from the
   object, without PyLong_AsLongLongAndOverflow's general path. 1 when it was one. A digit is
   at most 30 bits, so the value fits TYPE_INT. */
static inline int
compact_int(PyObject *v, long long *out)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)v))
        return 0;
    *out = (long long)PyUnstable_Long_CompactValue((PyLongObject *)v);
    return 1;
#else
    Py_ssize_t size = Py_SIZE(v);
    if (size < -1 || size > 1)
        return 0;
    long long d = size ? (long long)((PyLongObject *)v)->ob_digit[0] : 0;
    *out = size < 0 ? -d : d;
    return 1;
#endif
}

/* The common leaves, written inline by every encoder below before its general case. They run
   no Python code and allocate nothing, and ``encode`` and ``encode_plain`` write them alike; a
   caller at a depth past MAX_DEPTH takes its general case (an int there is not written here).

   ``w_small``: None, a bool or an exact int of one digit (most ids, counts, lengths), at most
   SMALL_ROOM bytes, written unchecked at ``p``; NULL, nothing written, for anything else.
   (Runs of them written with one ``reserve`` measured no cheaper than one ``reserve`` each.) */
#define SMALL_ROOM 5

static inline unsigned char *
w_small(unsigned char *p, PyObject *v)
{
    long long x;
    if (v == Py_None) {
        *p = 'N';
        return p + 1;
    }
    if (Py_TYPE(v) == &PyLong_Type && compact_int(v, &x))
        return w_type_int32(p, 'i', (int32_t)x);
    if (Py_TYPE(v) == &PyBool_Type) {
        *p = v == Py_True ? 'T' : 'F';
        return p + 1;
    }
    return NULL;
}

/* ``w_small``'s values, and an exact str that is compact ASCII (ops, request ids, names,
   kinds: its bytes are its UTF-8, read with no call, never a lone surrogate). 0 when written,
   -1 out of memory, 1 when ``v`` is none of these (nothing written). */
static inline int
put_leaf(rs_bytes *s, PyObject *v)
{
    if (Py_TYPE(v) == &PyUnicode_Type) {
        if (!PyUnicode_IS_COMPACT_ASCII(v) || PyUnicode_GET_LENGTH(v) > INT32_MAX)
            return 1;
        return put_sized(s, 'u', PyUnicode_DATA(v), PyUnicode_GET_LENGTH(v));
    }
    if (reserve(s, SMALL_ROOM) < 0)
        return -1;
    unsigned char *p = w_small(end_of(s), v);
    if (p == NULL)
        return 1;
    s->len = (char *)p - s->buf;
    return 0;
}

static int encode_any(rs_bytes *s, PyObject *v, int depth);

/* ``v`` (at ``depth``: a record's fields are at 1) as marshal version 2 writes it: 0, -1 with an
   error set, -2 nested deeper than MAX_DEPTH; on failure ``s`` is partly written (the caller
   cuts it back). The common leaves inline, the rest in ``encode_any``. */
static inline int
encode(rs_bytes *s, PyObject *v, int depth)
{
    if (depth <= MAX_DEPTH) {
        int r = put_leaf(s, v);
        if (r <= 0)
            return r;
    }
    return encode_any(s, v, depth);
}

/* Anything else: marshal's own writer, spliced in. */
static int
encode_by_marshal(rs_bytes *s, PyObject *v)
{
    PyObject *b = PyMarshal_WriteObjectToString(v, MARSHAL_VERSION);
    if (b == NULL)
        return -1;
    int r = put(s, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
    Py_DECREF(b);
    return r;
}

static int
encode_int(rs_bytes *s, PyObject *v)
{
    long long small;
    if (compact_int(v, &small))
        return put_type_int32(s, 'i', (int32_t)small);
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow)
        return encode_by_marshal(s, v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    return put_ll(s, x);
}

static int
encode_str(rs_bytes *s, PyObject *v)
{
    Py_ssize_t size;
    const char *utf8 = PyUnicode_AsUTF8AndSize(v, &size);
    if (utf8 == NULL) { /* lone surrogates: marshal writes them ("surrogatepass") */
        PyErr_Clear();
        return encode_by_marshal(s, v);
    }
    if (size > INT32_MAX)
        return encode_by_marshal(s, v);
    return put_sized(s, 'u', utf8, size);
}

/* marshal's TYPE_STRING, which it writes for bytes and for any other object with a buffer (a
   created node's tokens, an ``array('Q')``): copied straight from the buffer. */
static int
encode_buffer(rs_bytes *s, PyObject *v)
{
    Py_buffer view;
    if (PyObject_GetBuffer(v, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return encode_by_marshal(s, v);
    }
    int r;
    if (view.len > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "buffer too long to encode");
        r = -1;
    } else
        r = put_sized(s, 's', view.buf, view.len);
    PyBuffer_Release(&view);
    return r;
}

/* A tuple: its items cannot change while it is written (we hold it), so none is held apart. */
static int
encode_tuple(rs_bytes *s, PyObject *v, int depth)
{
    Py_ssize_t size = PyTuple_GET_SIZE(v);
    if (size > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "sequence too long to encode");
        return -1;
    }
    if (put_type_int32(s, '(', (int32_t)size) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < size; i++) {
        int r = encode(s, PyTuple_GET_ITEM(v, i), depth + 1);
        if (r < 0)
            return r;
    }
    return 0;
}

/* A value written here with no object allocated that the collector tracks (and so with no
   collection, no finalizer, no Python code run): None, a bool, an exact int, an exact str whose
   UTF-8 form can be made (it is then kept in the str; a lone surrogate's failure would allocate
   an exception, and so may collect). 0 with no error set when it is not one. */
static inline int
plain(PyObject *v)
{
    if (v == Py_None || v == Py_True || v == Py_False || PyLong_CheckExact(v))
        return 1;
    if (!PyUnicode_CheckExact(v))
        return 0;
    if (PyUnicode_IS_ASCII(v))
        return 1;
    if (PyUnicode_AsUTF8AndSize(v, NULL) != NULL)
        return 1;
    PyErr_Clear();
    return 0;
}

/* A dict (an eviction's freed slots per component), as marshal writes it: '{', each key and
   value in the dict's order, '0'. Written in one pass where every key and value is a leaf
   ``put_leaf`` writes (no code runs, so nothing can change the dict meanwhile); else, from the
   start again, only when every key and value is plain, so that nothing can change the dict
   while it is iterated the second time; any other dict goes to marshal's writer whole (the
   first pass may run code, and stops at the first value that is not plain). */
static int
encode_dict(rs_bytes *s, PyObject *v, int depth)
{
    Py_ssize_t pos = 0, start = s->len;
    PyObject *k, *x;
    int leaves = depth < MAX_DEPTH; /* (its keys and values are at depth + 1) */
    if (leaves) {
        if (put1(s, '{') < 0)
            return -1;
        while (leaves && PyDict_Next(v, &pos, &k, &x)) {
            int r = put_leaf(s, k);
            if (r == 0)
                r = put_leaf(s, x);
            if (r < 0)
                return -1;
            leaves = r == 0;
        }
        if (leaves)
            return put1(s, '0');
        s->len = start; /* not all leaves: the two passes below */
        pos = 0;
    }
    while (PyDict_Next(v, &pos, &k, &x))
        if (!plain(k) || !plain(x))
            return encode_by_marshal(s, v);
    if (put1(s, '{') < 0)
        return -1;
    pos = 0;
    while (PyDict_Next(v, &pos, &k, &x)) {
        int r = encode(s, k, depth + 1);
        if (r == 0)
            r = encode(s, x, depth + 1);
        if (r < 0)
            return r;
    }
    return put1(s, '0');
}

/* A list ('['). marshal's writer (a set's sort) can run a collection, and so finalizers, which
   may change a list: each item is held while it is written, and a list whose size changed fails
   the record (the Python path takes it). */
static int
encode_list(rs_bytes *s, PyObject *v, int depth)
{
    Py_ssize_t size = PySequence_Fast_GET_SIZE(v);
    if (size > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "sequence too long to encode");
        return -1;
    }
    if (put_type_int32(s, '[', (int32_t)size) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < size; i++) {
        if (PySequence_Fast_GET_SIZE(v) != size) {
            PyErr_SetString(PyExc_RuntimeError, "list changed size during encoding");
            return -1;
        }
        PyObject *item = Py_NewRef(PySequence_Fast_GET_ITEM(v, i));
        int r = encode(s, item, depth + 1);
        Py_DECREF(item);
        if (r < 0)
            return r;
    }
    return 0;
}

/* None, True or False, written (1, or -1 out of memory); 0 for anything else. */
static inline int
put_singleton(rs_bytes *s, PyObject *v)
{
    char c = v == Py_None ? 'N' : v == Py_True ? 'T' : v == Py_False ? 'F' : 0;
    return c == 0 ? 0 : put1(s, c) < 0 ? -1 : 1;
}

/* ``encode``'s general case: any value past MAX_DEPTH, else one ``put_leaf`` did not write. */
static int
encode_any(rs_bytes *s, PyObject *v, int depth)
{
    if (depth > MAX_DEPTH) {
        int one = put_singleton(s, v);
        if (one)
            return one < 0 ? -1 : 0;
        return -2; /* append hands the whole record to marshal: its depth limit is per dump */
    }
    if (PyTuple_CheckExact(v))
        return encode_tuple(s, v, depth);
    if (PyLong_CheckExact(v))
        return encode_int(s, v);
    if (PyUnicode_CheckExact(v))
        return encode_str(s, v);
    if (PyList_CheckExact(v))
        return encode_list(s, v, depth);
    if (PyDict_CheckExact(v))
        return encode_dict(s, v, depth);
    if (PyObject_CheckBuffer(v)) /* no type marshal checks before its buffer case has one */
        return encode_buffer(s, v);
    return encode_by_marshal(s, v);
}

/* ---- plain values, for the ledger's direct records (cache/_direct.h) ------------------------ */

static PyTypeObject *array_type; /* array.array: a created node's tokens */

/* A str that holds a lone surrogate (UTF-8 cannot; marshal writes it "surrogatepass"), or
   that is not ready. */
static int
has_surrogate(PyObject *v)
{
#if PY_VERSION_HEX < 0x030C0000
    if (!PyUnicode_IS_READY(v)) /* a legacy str (not plain: readying it allocates) */
        return 1;
#endif
    int kind = PyUnicode_KIND(v);
    if (kind == PyUnicode_1BYTE_KIND)
        return 0;
    const void *data = PyUnicode_DATA(v);
    for (Py_ssize_t i = 0, n = PyUnicode_GET_LENGTH(v); i < n; i++)
        if (Py_UNICODE_IS_SURROGATE(PyUnicode_READ(kind, data, i)))
            return 1;
    return 0;
}

static int encode_plain_any(rs_bytes *s, PyObject *v, int depth);

/* ``v`` as ``encode`` writes it, where that runs no Python code and calls nothing that can
   (no marshal writer, no allocation of an object the collector tracks): RS_NOT_PLAIN for
   anything else, with ``s`` partly written (the caller cuts it back). So nothing can change a
   container while it is walked, and the bytes are what the same value gives at the op's end
   (the ledger writes a mutation when it is made; the values the cache records are not changed
   after, and a test holds the two paths to the same bytes). The common leaves inline
   (``put_leaf``), the rest in ``encode_plain_any``. */
static inline int
encode_plain(rs_bytes *s, PyObject *v, int depth)
{
    if (depth <= MAX_DEPTH) {
        int r = put_leaf(s, v);
        if (r <= 0)
            return r;
    }
    return encode_plain_any(s, v, depth);
}

/* ``size`` items, each at ``depth``, as ``encode_plain`` writes them (a tuple's, a list's, a
   mutation's). */
static inline int
put_plain_items(rs_bytes *s, PyObject *const *items, Py_ssize_t size, int depth)
{
    for (Py_ssize_t i = 0; i < size; i++) {
        int r = encode_plain(s, items[i], depth);
        if (r != 0)
            return r;
    }
    return 0;
}

/* ``encode_plain``'s general case: any value past MAX_DEPTH, else one ``put_leaf`` did not
   write. */
static int
encode_plain_any(rs_bytes *s, PyObject *v, int depth)
{
    if (depth > MAX_DEPTH) {
        int one = put_singleton(s, v);
        if (one)
            return one < 0 ? -1 : 0;
        return RS_NOT_PLAIN;
    }
    if (PyTuple_CheckExact(v) || PyList_CheckExact(v)) {
        Py_ssize_t size = Py_SIZE(v);
        PyObject **items = PyTuple_CheckExact(v) ? ((PyTupleObject *)v)->ob_item
                                                 : ((PyListObject *)v)->ob_item;
        if (size > INT32_MAX)
            return RS_NOT_PLAIN;
        if (put_type_int32(s, PyTuple_CheckExact(v) ? '(' : '[', (int32_t)size) < 0)
            return -1;
        return put_plain_items(s, items, size, depth + 1);
    }
    if (PyLong_CheckExact(v)) {
        long long x;
        if (!compact_int(v, &x)) {
            int overflow;
            x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow)
                return RS_NOT_PLAIN;
        }
        return put_ll(s, x);
    }
    if (PyUnicode_CheckExact(v)) {
        if (has_surrogate(v)) /* its UTF-8 error would allocate an exception, so may collect */
            return RS_NOT_PLAIN;
        Py_ssize_t size;
        const char *utf8 = PyUnicode_AsUTF8AndSize(v, &size); /* kept in the str */
        if (utf8 == NULL)
            return -1; /* out of memory */
        if (size > INT32_MAX)
            return RS_NOT_PLAIN;
        return put_sized(s, 'u', utf8, size);
    }
    if (PyDict_CheckExact(v)) {
        Py_ssize_t pos = 0;
        PyObject *k, *x;
        if (put1(s, '{') < 0)
            return -1;
        while (PyDict_Next(v, &pos, &k, &x)) {
            int r = encode_plain(s, k, depth + 1);
            if (r == 0)
                r = encode_plain(s, x, depth + 1);
            if (r != 0)
                return r;
        }
        return put1(s, '0');
    }
    if (PyBytes_CheckExact(v)) {
        if (PyBytes_GET_SIZE(v) > INT32_MAX)
            return RS_NOT_PLAIN;
        return put_sized(s, 's', PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v));
    }
    if (Py_TYPE(v) == array_type) { /* its buffer is C's: no __buffer__ method runs */
        Py_buffer view;
        if (PyObject_GetBuffer(v, &view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            return RS_NOT_PLAIN;
        }
        int r = view.len > INT32_MAX ? RS_NOT_PLAIN : put_sized(s, 's', view.buf, view.len);
        PyBuffer_Release(&view);
        return r;
    }
    return RS_NOT_PLAIN;
}

/* A mutation's 7-tuple header and its first two items, ``seq`` and ``cur_op``, in one
   reserve (``direct_mutation``'s and ``direct_state``'s start). */
static inline int
put_mutation_head(rs_bytes *out, long long seq, long long cur_op)
{
    if (reserve(out, 5 + 2 * LONG64_ROOM) < 0)
        return -1;
    unsigned char *p = w_type_int32(end_of(out), '(', 7);
    p = w_ll(p, seq);
    out->len = (char *)w_ll(p, cur_op) - out->buf;
    return 0;
}

/* rs_direct_api.mutation: the 7-tuple ``(seq, cur_op, kind, node, comp, tier, value)``, its
   items at the depth a record's mutation list puts them. */
static int
direct_mutation(rs_bytes *out, long long seq, long long cur_op, PyObject *const *items)
{
    Py_ssize_t start = out->len;
    if (put_mutation_head(out, seq, cur_op) < 0)
        return -1;
    int r = put_plain_items(out, items, 5, 3);
    if (r != 0)
        out->len = start;
    return r;
}

/* rs_direct_api.state: ``(seq, cur_op, kind, node, comp, None, (lens, refs))`` as
   ``direct_mutation`` writes it with the value's tuples made; the numbers after one reserve. */
static int
direct_state(rs_bytes *out, long long seq, long long cur_op, PyObject *const *items,
             const rs_state *st)
{
    Py_ssize_t start = out->len;
    if (put_mutation_head(out, seq, cur_op) < 0)
        return -1;
    int r = put_plain_items(out, items, 3, 3);
    if (r == 0 && st->ntiers + st->nrefs > INT32_MAX / LONG64_ROOM)
        r = RS_NOT_PLAIN; /* (never: the ledger gives a few) */
    if (r == 0 && (r = reserve(out, 1 + 3 * 5 + (st->ntiers + st->nrefs) * LONG64_ROOM)) == 0) {
        unsigned char *p = end_of(out);
        *p++ = 'N'; /* no tier */
        p = w_type_int32(p, '(', 2);
        p = w_type_int32(p, '(', (int32_t)st->ntiers);
        for (Py_ssize_t t = 0; t < st->ntiers; t++)
            p = (st->none >> t) & 1 ? (*p = 'N', p + 1) : w_ll(p, st->lens[t]);
        p = w_type_int32(p, '(', (int32_t)st->nrefs);
        for (Py_ssize_t t = 0; t < st->nrefs; t++)
            p = w_ll(p, st->refs[t]);
        out->len = (char *)p - out->buf;
    }
    if (r != 0)
        out->len = start;
    return r;
}

/* ---- the call ------------------------------------------------------------------------------ */

#define OP_FIELDS 10 /* an OpRecord: (op_id, op, start_ns, end_ns, req_id, context, ...) */
#define CTX 5

static PyObject *
call_back(PyObject *fn, PyObject *op, PyObject *muts)
{
    PyObject *args[2] = {op, muts};
    return PyObject_Vectorcall(fn, args, 2, NULL);
}

/* The parent span's ids of ``ctx`` (a new reference), or NULL with an error. */
static PyObject *
parent_ids(Sink *s, PyObject *ctx)
{
    if (ctx == s->last_ctx && s->last_parent != NULL)
        return Py_NewRef(s->last_parent);
    PyObject *parent = PyObject_CallOneArg(s->parent_of, ctx);
    if (parent == NULL)
        return NULL;
    if (!PyTuple_CheckExact(parent) || PyTuple_GET_SIZE(parent) != 4) {
        PyErr_Format(PyExc_TypeError, "parent_of returned %R, not a 4-tuple", parent);
        Py_DECREF(parent);
        return NULL;
    }
    Py_XSETREF(s->last_ctx, Py_NewRef(ctx));
    Py_XSETREF(s->last_parent, Py_NewRef(parent)); /* may run code: we hold our own ref */
    return parent;
}

/* A record nested deeper than MAX_DEPTH, by marshal's own writer, so that its depth limit
   applies as it does on the Python path (``encode.decode`` reads such a record back alone when
   the batch's list puts it one level past the limit). */
static int
encode_deep(rs_bytes *s, PyObject *op, PyObject *parent, PyObject *muts)
{
    PyObject *rec = PyTuple_New(OP_FIELDS + 1);
    if (rec == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < OP_FIELDS; i++)
        PyTuple_SET_ITEM(rec, i, Py_NewRef(i == CTX ? parent : PyTuple_GET_ITEM(op, i)));
    PyTuple_SET_ITEM(rec, OP_FIELDS, Py_NewRef(muts));
    int r = encode_by_marshal(s, rec);
    Py_DECREF(rec);
    return r;
}

/* None, a bool, an exact int or an exact str: a value that cannot change, and that ``encode``
   writes the same way every time. */
static inline int
immutable(PyObject *v)
{
    return v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v) || PyUnicode_CheckExact(v);
}

/* ``parent`` (``parent_ids``'s 4-tuple) written to ``b``. ``parent_ids`` hands back the same
   tuple while the context is the same, so its encoding is kept, with a reference to the tuple
   (held, it cannot be freed and its address given to another), and copied while ``parent`` is
   that object: only for a tuple of values that cannot change (``immutable``). A new one is
   encoded into ``parent_enc`` first, not into ``b``: Python code may run meanwhile (marshal's
   writer on a trace id past 64 bits), and a ``take`` then moves the record being written
   (``busy`` keeps every other writer out of ``parent_enc``). ``encode``'s return. */
static int
put_parent(Sink *s, rs_bytes *b, PyObject *parent)
{
    rs_bytes *enc = &s->parent_enc;
    if (parent != s->parent_encoded) {
        Py_CLEAR(s->parent_encoded);
        enc->len = 0;
        int r = encode(enc, parent, 1);
        if (r < 0)
            return r;
        int keep = 1;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(parent); i++)
            keep = keep && immutable(PyTuple_GET_ITEM(parent, i));
        if (keep)
            s->parent_encoded = Py_NewRef(parent);
    }
    return put(b, enc->buf, enc->len);
}

/* Append one record; on failure the buffer is as it was and an error is set. */
static int
append(Sink *s, PyObject *op, PyObject *muts)
{
    PyObject *parent = parent_ids(s, PyTuple_GET_ITEM(op, CTX));
    if (parent == NULL)
        return -1;
    /* Python code may run from here to the end of the record (see the module's comment) */
    s->busy = 1;
    rs_bytes *b = &s->out;
    int r = put_type_int32(b, '(', OP_FIELDS + 1);
    for (Py_ssize_t i = 0; r == 0 && i < OP_FIELDS; i++)
        r = i == CTX ? put_parent(s, b, parent) : encode(b, PyTuple_GET_ITEM(op, i), 1);
    if (r == 0)
        r = encode(b, muts, 1);
    if (r == -2) { /* nested deeper than MAX_DEPTH: marshal's own writer, on the whole record */
        b->len = s->done;
        r = encode_deep(b, op, parent, muts);
    }
    Py_DECREF(parent);
    s->busy = 0;
    if (r < 0) {
        b->len = s->done; /* take() may have moved the record's start while Python code ran */
        return -1;
    }
    s->done = b->len;
    s->n++;
    return 0;
}

/* seq_last of an op record, when it is an exact int of 64 bits */
static void
note_seq(Sink *s, PyObject *op)
{
    if (PyTuple_CheckExact(op) && PyTuple_GET_SIZE(op) == OP_FIELDS) {
        PyObject *last = PyTuple_GET_ITEM(op, 7);
        if (PyLong_CheckExact(last)) {
            int overflow;
            long long v = PyLong_AsLongLongAndOverflow(last, &overflow);
            if (!overflow && !(v == -1 && PyErr_Occurred()))
                s->recorded_seq = v;
            else if (!overflow)
                PyErr_Clear();
        }
    }
}

static int
ready(Sink *s)
{
    return s->full != NULL && s->fallback != NULL && s->parent_of != NULL;
}

static PyObject *
sink_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Sink *s = (Sink *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "Sink takes (op, mutations)");
        return NULL;
    }
    PyObject *op = args[0], *muts = args[1], *r = NULL;
    if (!ready(s)) {
        PyErr_SetString(PyExc_RuntimeError, "Sink is not initialised (or was cleared)");
        return NULL;
    }
    note_seq(s, op);
    /* called from code run mid-record (a finalizer), or not an op record: the Python path */
    if (s->busy || !PyTuple_CheckExact(op) || PyTuple_GET_SIZE(op) != OP_FIELDS
        || !PyList_CheckExact(muts))
        r = call_back(s->fallback, op, muts);
    else if (s->n >= s->limit)
        r = call_back(s->full, op, muts);
    else if (append(s, op, muts) == 0)
        r = Py_NewRef(Py_None);
    else {
        PyErr_Clear(); /* the Python path encodes it otherwise, or counts it as lost */
        r = call_back(s->fallback, op, muts);
    }
    return r;
}

/* ---- the ledger's direct records (cache/_direct.h) --------------------------------------- */

static PyTypeObject SinkType;

/* rs_direct_api.record: ``append`` from the record's fields, its mutations' bytes copied in;
   every case ``sink_vectorcall`` would send to ``full`` or ``fallback`` is handed back. */
static int
direct_record(PyObject *self, const rs_op_head *h, const char *muts, Py_ssize_t len)
{
    if (Py_TYPE(self) != &SinkType || !ready((Sink *)self))
        return RS_NOT_TAKEN; /* (the call with the objects raises what it raises) */
    Sink *s = (Sink *)self;
    s->recorded_seq = h->seq_last;
    if (s->busy || s->n >= s->limit)
        return RS_NOT_TAKEN;
    PyObject *parent = parent_ids(s, h->ctx);
    if (parent == NULL) {
        PyErr_Clear();
        return RS_FAILED;
    }
    s->busy = 1; /* Python code may run from here (marshal's writer on an odd attribute) */
    rs_bytes *b = &s->out;
    int r = put_type_int32(b, '(', OP_FIELDS + 1);
    if (r == 0)
        r = put_ll(b, h->op_id);
    if (r == 0)
        r = encode(b, h->op, 1);
    if (r == 0)
        r = put_ll2(b, h->start_ns, h->end_ns);
    if (r == 0)
        r = encode(b, h->req_id, 1);
    if (r == 0)
        r = put_parent(s, b, parent);
    if (r == 0)
        r = put_ll2(b, h->seq_first, h->seq_last);
    if (r == 0) /* (a tuple, but for an odd builder's) */
        r = PyTuple_CheckExact(h->attrs) ? encode_tuple(b, h->attrs, 1) : encode(b, h->attrs, 1);
    if (r == 0 && (r = reserve(b, 1 + len)) == 0) {
        b->buf[b->len] = 'N'; /* error */
        memcpy(b->buf + b->len + 1, muts, (size_t)len);
        b->len += 1 + len;
    }
    Py_DECREF(parent);
    s->busy = 0;
    if (r < 0) {
        b->len = s->done;
        if (r == -2) /* nested deeper than MAX_DEPTH: the call with the objects (encode_deep) */
            return RS_NOT_TAKEN;
        PyErr_Clear();
        return RS_FAILED;
    }
    s->done = b->len;
    s->n++;
    return RS_DONE;
}

static PyObject *
direct_fallback(PyObject *self, PyObject *op, PyObject *muts)
{
    Sink *s = (Sink *)self;
    if (Py_TYPE(self) != &SinkType || !ready(s)) {
        PyErr_SetString(PyExc_RuntimeError, "Sink is not initialised (or was cleared)");
        return NULL;
    }
    return call_back(s->fallback, op, muts);
}

static const rs_direct_api direct_api = {
    RS_DIRECT_VERSION, direct_mutation, direct_state, direct_record, direct_fallback,
};

/* ---- methods -------------------------------------------------------------------------------- */

static PyObject *
contents(Sink *s)
{
    /* whole records only: a record being written (Python code ran mid-record) stays */
    PyObject *data = PyBytes_FromStringAndSize(s->out.buf, s->done);
    if (data == NULL)
        return NULL;
    PyObject *out = Py_BuildValue("(nN)", s->n, data);
    return out;
}

/* A buffer grown past this by a burst is given back, not kept (see ``take_batch``). */
#define BURST_CAP ((Py_ssize_t)1 << 24)

/* Empty the buffer of its whole records: a record being written moves to its start. */
static void
forget_records(Sink *s)
{
    if (s->out.len > s->done) /* a record being written: keep its start */
        memmove(s->out.buf, s->out.buf + s->done, (size_t)(s->out.len - s->done));
    s->out.len -= s->done;
    s->done = 0;
    s->n = 0;
    if (s->out.len == 0 && s->out.cap > BURST_CAP) { /* a burst grew it: give the memory back */
        PyMem_Free(s->out.buf);
        s->out.buf = NULL;
        s->out.cap = 0;
    }
}

static PyObject *
sink_take(PyObject *self, PyObject *Py_UNUSED(unused))
{
    Sink *s = (Sink *)self;
    PyObject *out = contents(s);
    if (out != NULL)
        forget_records(s);
    return out;
}

/* ``take_batch``: the whole records as one marshal list (``[``, the count, the records), the
   blob a batch ships as. The copy of a batch (~3 MB) lands in a new ``bytes`` whose pages the
   kernel maps as they are first written: ~730 page faults, ~1 ms, which with the GIL held the
   cache's thread waited out. So the buffers swap first: the sink writes on into its spare
   (the buffer the previous batch was copied from, whose pages stay mapped), and the records
   are copied from the buffer they are in with the GIL released, the cache's thread recording
   meanwhile. Small batches, a take already copying (another thread's) and a spare that cannot
   be made copy in place, holding the GIL.

   A burst (the drain thread blocked while the cache recorded on) can grow the buffer past
   ``BURST_CAP``; it is not kept as a spare, and the buffer the sink swaps to is made no larger
   than ``BURST_CAP``: sized after the burst's buffer instead, each take freed that one and made
   another (64 MB at 100 k nodes, mapped anew by glibc every time), so after one burst every batch
   wrote its records into fresh pages for the rest of the run: ~1,300 page faults on the cache's
   thread a 1,500-request batch where ~100 is the norm, and a few points of ops/s (issue 17). */
#define SWAP_MIN (64 * 1024)

static PyObject *
sink_take_batch(PyObject *self, PyObject *Py_UNUSED(unused))
{
    Sink *s = (Sink *)self;
    Py_ssize_t n = s->n, done = s->done, tail = s->out.len - s->done;
    if (n > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "too many records for one marshal list");
        return NULL;
    }
    PyObject *data = PyBytes_FromStringAndSize(NULL, done + 5);
    if (data == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(data);
    p[0] = '[';
    for (int i = 0; i < 4; i++)
        p[1 + i] = (unsigned char)(((uint32_t)n >> (8 * i)) & 0xff);
    char *next = NULL;
    Py_ssize_t next_cap = s->out.cap < BURST_CAP ? s->out.cap : BURST_CAP;
    if (next_cap < tail)
        next_cap = tail;
    if (done >= SWAP_MIN && !s->taking) {
        if (s->spare != NULL && s->spare_cap >= next_cap) {
            next = s->spare;
            next_cap = s->spare_cap;
        }
        else if ((next = PyMem_Malloc((size_t)next_cap)) != NULL)
            PyMem_Free(s->spare); /* too small for this buffer's records, if any */
        if (next != NULL) {
            s->spare = NULL;
            s->spare_cap = 0;
        }
    }
    if (next == NULL) { /* in place: copy, then empty the buffer */
        if (done)
            memcpy(p + 5, s->out.buf, (size_t)done);
        forget_records(s);
        return Py_BuildValue("(nN)", n, data);
    }
    char *full = s->out.buf;
    Py_ssize_t full_cap = s->out.cap;
    if (tail) /* a record being written (Python code ran mid-record): it goes on in next */
        memcpy(next, full + done, (size_t)tail);
    s->out.buf = next;
    s->out.cap = next_cap;
    s->out.len = tail;
    s->done = 0;
    s->n = 0;
    s->taking = 1;
    Py_BEGIN_ALLOW_THREADS
    memcpy(p + 5, full, (size_t)done);
    Py_END_ALLOW_THREADS
    s->taking = 0;
    if (full_cap > BURST_CAP || s->spare != NULL) /* a burst grew it (or a spare was made) */
        PyMem_Free(full);
    else {
        s->spare = full;
        s->spare_cap = full_cap;
    }
    return Py_BuildValue("(nN)", n, data);
}

static PyObject *
sink_peek(PyObject *self, PyObject *Py_UNUSED(unused))
{
    return contents((Sink *)self);
}

static PyObject *
sink_forget_context(PyObject *self, PyObject *Py_UNUSED(unused))
{
    Sink *s = (Sink *)self;
    Py_CLEAR(s->last_ctx);
    Py_CLEAR(s->last_parent);
    Py_CLEAR(s->parent_encoded); /* (its buffer stays: a record being written may use it) */
    Py_RETURN_NONE;
}

static PyMethodDef sink_methods[] = {
    {"take", sink_take, METH_NOARGS,
     "take() -> (records, bytes): the buffered records, their encodings concatenated (a marshal "
     "list's items); the buffer is emptied"},
    {"take_batch", sink_take_batch, METH_NOARGS,
     "take_batch() -> (records, blob): as take(), the records as one marshal list (what "
     "``encode.join_encoded`` makes of them: a batch ready to ship), with one copy"},
    {"peek", sink_peek, METH_NOARGS, "peek() -> (records, bytes): as take(), leaving them"},
    {"forget_context", sink_forget_context, METH_NOARGS,
     "drop the remembered context (a forked child's contexts are not its parent's)"},
    {NULL, NULL, 0, NULL},
};

/* ---- the type -------------------------------------------------------------------------------- */

static int
sink_init(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"full", "fallback", "parent_of", NULL};
    Sink *s = (Sink *)self;
    PyObject *full, *fallback, *parent_of;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:Sink", names, &full, &fallback, &parent_of))
        return -1;
    PyObject *fns[3] = {full, fallback, parent_of};
    for (int i = 0; i < 3; i++)
        if (!PyCallable_Check(fns[i])) {
            PyErr_Format(PyExc_TypeError, "Sink: %s=%R is not callable", names[i], fns[i]);
            return -1;
        }
    Py_XSETREF(s->full, Py_NewRef(full));
    Py_XSETREF(s->fallback, Py_NewRef(fallback));
    Py_XSETREF(s->parent_of, Py_NewRef(parent_of));
    s->limit = 0;
    s->recorded_seq = -1;
    return 0;
}

static PyObject *
sink_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwds))
{
    Sink *s = (Sink *)type->tp_alloc(type, 0);
    if (s != NULL)
        s->vectorcall = sink_vectorcall;
    return (PyObject *)s;
}

static int
sink_traverse(PyObject *self, visitproc visit, void *arg)
{
    Sink *s = (Sink *)self;
    Py_VISIT(s->full);
    Py_VISIT(s->fallback);
    Py_VISIT(s->parent_of);
    Py_VISIT(s->last_ctx);
    Py_VISIT(s->last_parent);
    Py_VISIT(s->parent_encoded);
    return 0;
}

static int
sink_clear(PyObject *self)
{
    Sink *s = (Sink *)self;
    Py_CLEAR(s->full);
    Py_CLEAR(s->fallback);
    Py_CLEAR(s->parent_of);
    Py_CLEAR(s->last_ctx);
    Py_CLEAR(s->last_parent);
    Py_CLEAR(s->parent_encoded);
    return 0;
}

static void
sink_dealloc(PyObject *self)
{
    Sink *s = (Sink *)self;
    PyObject_GC_UnTrack(self);
    sink_clear(self);
    PyMem_Free(s->out.buf);
    PyMem_Free(s->spare);
    PyMem_Free(s->parent_enc.buf);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *
sink_get_limit(PyObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(((Sink *)self)->limit);
}

static int
sink_set_limit(PyObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL || !PyLong_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "limit must be an int");
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow > 0 || v > PY_SSIZE_T_MAX)
        v = PY_SSIZE_T_MAX;
    else if (overflow < 0 || v < 0)
        v = 0;
    ((Sink *)self)->limit = (Py_ssize_t)v;
    return 0;
}

static PyObject *
sink_get_n(PyObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(((Sink *)self)->n);
}

static PyObject *
sink_get_nbytes(PyObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(((Sink *)self)->out.len);
}

static PyObject *
sink_get_seq(PyObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(((Sink *)self)->recorded_seq);
}

static PyObject *
sink_get_capacity(PyObject *self, void *Py_UNUSED(closure))
{
    Sink *s = (Sink *)self;
    return Py_BuildValue("(nn)", s->out.cap, s->spare == NULL ? (Py_ssize_t)0 : s->spare_cap);
}

static PyGetSetDef sink_getset[] = {
    {"limit", sink_get_limit, sink_set_limit,
     "records the buffer may hold before a call goes to ``full`` (clamped to 0..maxsize)", NULL},
    {"n", sink_get_n, NULL, "records in the buffer", NULL},
    {"nbytes", sink_get_nbytes, NULL, "bytes in the buffer", NULL},
    {"capacity", sink_get_capacity, NULL,
     "``(buffer, spare)``: the bytes allocated for the buffer and for its spare (0: none)", NULL},
    {"recorded_seq", sink_get_seq, NULL, "seq_last of the newest op handed to the sink (-1)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SinkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "radixscope.telemetry.record._sink.Sink",
    .tp_doc = "Sink(full, fallback, parent_of): the recorder's per-op call (see the module).",
    .tp_basicsize = sizeof(Sink),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Sink, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = sink_new,
    .tp_init = sink_init,
    .tp_traverse = sink_traverse,
    .tp_clear = sink_clear,
    .tp_dealloc = sink_dealloc,
    .tp_methods = sink_methods,
    .tp_getset = sink_getset,
};

static struct PyModuleDef sink_module = {
    PyModuleDef_HEAD_INIT, "_sink",
    "The recorder's per-op encoder (see telemetry/record/sink.py).", -1, NULL, NULL, NULL, NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__sink(void)
{
    if (PyType_Ready(&SinkType) < 0)
        return NULL;
    PyObject *arr = PyImport_ImportModule("array");
    if (arr == NULL)
        return NULL;
    array_type = (PyTypeObject *)PyObject_GetAttrString(arr, "array"); /* kept for good */
    Py_DECREF(arr);
    if (array_type == NULL)
        return NULL;
    /* the ledger's table, found on the type of the recorder it calls (cache/_direct.h) */
    PyObject *api = PyCapsule_New((void *)&direct_api, RS_DIRECT_CAPSULE, NULL);
    if (api == NULL || PyDict_SetItemString(SinkType.tp_dict, RS_DIRECT_ATTR, api) < 0) {
        Py_XDECREF(api);
        return NULL;
    }
    PyType_Modified(&SinkType);
    PyObject *m = PyModule_Create(&sink_module);
    if (m == NULL || PyModule_AddIntConstant(m, "ABI", SINK_ABI) < 0
        || PyModule_AddIntConstant(m, "DIRECT_VERSION", RS_DIRECT_VERSION) < 0
        || PyModule_AddObjectRef(m, "DIRECT_API", api) < 0
        || PyModule_AddType(m, &SinkType) < 0) {
        Py_DECREF(api);
        Py_XDECREF(m);
        return NULL;
    }
    Py_DECREF(api);
    return m;
}
