/* The cache's ledger in C (``radixscope.cache._ledger``): the per-op bookkeeping of recording.

``cache/ledger.py`` documents the interface and holds ``PyLedger``, the Python version this
one must behave as (tests/cache/test_ledger.py runs both): ``run(op, req_id, fn, *args)`` runs
one public operation and, at the top level with recording on, hands ``record(op_record,
mutations)`` its record; ``m(kind, node, comp, tier, value)`` numbers one state change; ``take()``
hands over the mutations kept so far. The counters (``seq``, ``op_id``, ``cur_op``, ``depth``) and
``on`` are read-write attributes, ``muts`` the running op's list.

A recorded op costs here what the Python version spends on interpreting: its ids, clock and
context, the record's tuple and the swap of the mutation list are a few C statements, and the
attribute builder (``attrs[op]``) and the recorder are called with vectorcall (a builder
whose type has the entry of ``cache/_builders.h``, ``native.Fields``, through that entry, with
the op's arguments as they came: no tuple made). Errors go back to
the cache's own methods (``_op_failed``, ``_after_error``, ``_recorder_failed``), called with
the exception as an argument; the cache is held by a weak reference (no cycle keeps a cache's
buffers alive). ``LEDGER_ABI`` changes whenever the interface does: ``ledger.py`` refuses a
build whose number is not its own.

Direct records (``cache/_direct.h``; ``ledger.py`` documents what a caller sees). Where
``record``'s type carries the table, ``append_mutation`` has the table's ``mutation`` write the
7-tuple into ``mbuf`` (marshal's list of the op's mutations, five bytes kept in front for the
list's header) and makes no object; ``record_op`` hands ``record`` the fields and the bytes.
The state: the op's mutations are either all in ``mbuf`` (``mcount`` of them) or all in
``muts`` (``listed``, or direct records off), never split. ``to_list`` moves them from the
first to the second (a value not plain, ``muts`` read, ``direct`` turned off); ``listed`` is
reset when the op's record is handed over or ``take`` takes the list. The buffer is detached
before anything that can run Python code (``detach``: what a builder or a finalizer records
meanwhile goes to a buffer of its own), and a decode runs with the collector off (``decode``:
no finalizer can take or record while the decoded mutations are in neither place). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <marshal.h>
#include <structmember.h>
#include <stdint.h>
#include <time.h>

#include "_builders.h"
#include "_direct.h"
#include "_slots.h"

#define LEDGER_ABI 5

typedef struct {
    PyObject_HEAD
    long long seq, op_id, cur_op, depth;
    int on;
    PyObject *muts;              /* list: the running op's mutations */
    PyObject *cache;             /* weakref to the owner */
    PyObject *record;            /* record(op_record, mutations) */
    PyObject *ctx_var, *ctx_fn;  /* the caller's context: a ContextVar, or a callable, or none */
    PyObject *attrs;             /* dict: op -> builder(cache, out, args) */
    PyObject *state_kind;        /* set_states: the kind of ``state``'s mutations, */
    PyObject *state_names;       /* each component's name (a tuple), */
    PyObject *state_sizes;       /* and per component a tuple of per-tier size callables */
    slot_hint hints[4];          /* state()'s reads: a node's id and data, a component's
                                    values and refs (``slot_get``) */
    PyObject *pool_kind;         /* set_pools: the kind of ``pool``'s mutations, */
    PyObject *pool_tiers;        /* each tier's label (a tuple) */
    PyObject *cur_obj;           /* cur_op as an int object, made once per op (NULL: none) */
    long long cur_obj_val;       /* the value cur_obj holds */
    PyObject *weakreflist;
    /* native attribute builders (cache/_builders.h): */
    PyTypeObject *btype;         /* a builder type that has the table (held), or NULL */
    PyObject *bholder;           /* the capsule holding it */
    const rs_builder_api *bapi;  /* the table */
    PyTypeObject *plain_type;    /* the last builder type found without one (compared only) */
    /* direct records (cache/_direct.h): */
    const rs_direct_api *api;    /* the recorder's table (NULL: it has none) */
    PyObject *api_holder;        /* the capsule it is in */
    int direct;                  /* use it (the ``direct`` attribute) */
    int listed;                  /* the running op's mutations are in ``muts`` */
    rs_bytes mbuf;               /* else here: marshal's list of them, its header space first */
    Py_ssize_t mcount;           /* how many */
} Ledger;

#define LIST_HEAD 5 /* marshal's list header: '[' and the item count (4 bytes, little-endian) */
static const char EMPTY_LIST[LIST_HEAD] = {'[', 0, 0, 0, 0};

static long long
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* what time.time_ns() reads */
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The owner (a new reference), or NULL with RuntimeError when it was freed. */
static PyObject *
owner(Ledger *L)
{
    PyObject *cache = NULL;
#if PY_VERSION_HEX >= 0x030D0000
    if (L->cache != NULL && PyWeakref_GetRef(L->cache, &cache) < 0)
        return NULL;
#else
    if (L->cache != NULL) {
        cache = PyWeakref_GetObject(L->cache); /* borrowed; None once the cache is gone */
        if (cache == NULL)
            return NULL;
        cache = cache == Py_None ? NULL : Py_NewRef(cache);
    }
#endif
    if (cache == NULL)
        PyErr_SetString(PyExc_RuntimeError, "the ledger's cache was freed");
    return cache;
}

/* ---- direct records: the mutations' buffer ----------------------------------------------- */

/* The recorder's direct table, when its type has one of our version (NULL: none; -1 and an
   error: looking it up raised something other than AttributeError), and the capsule holding it
   (a new reference, kept while the table is used: a type's attribute can be replaced). */
static int
find_api(PyObject *record, const rs_direct_api **api, PyObject **holder)
{
    *api = NULL;
    *holder = NULL;
    PyObject *cap = PyObject_GetAttrString((PyObject *)Py_TYPE(record), RS_DIRECT_ATTR);
    if (cap == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    if (PyCapsule_IsValid(cap, RS_DIRECT_CAPSULE)) {
        const rs_direct_api *got = PyCapsule_GetPointer(cap, RS_DIRECT_CAPSULE);
        if (got != NULL && got->version == RS_DIRECT_VERSION) {
            *api = got;
            *holder = cap;
            return 0;
        }
    }
    Py_DECREF(cap);
    return 0;
}

/* Mutations go to the buffer (not to ``muts``) */
static inline int
writes_direct(Ledger *L)
{
    return L->api != NULL && L->direct && !L->listed;
}

/* The buffer's mutations handed to ``*b`` (its memory too), the ledger's buffer left empty:
   done before any Python code runs (a finalizer's mutations then go to a buffer of their own). */
static void
detach(Ledger *L, rs_bytes *b, Py_ssize_t *count)
{
    *b = L->mbuf;
    *count = L->mcount;
    L->mbuf.buf = NULL;
    L->mbuf.len = LIST_HEAD;
    L->mbuf.cap = 0;
    L->mcount = 0;
}

/* ``b``'s memory back to the ledger for the next op's mutations (when none was written
   meanwhile, and it is not a burst's), else freed. */
static void
reattach(Ledger *L, rs_bytes *b)
{
    if (L->mbuf.buf == NULL && b->cap <= (1 << 20)) {
        L->mbuf.buf = b->buf;
        L->mbuf.cap = b->cap;
        L->mbuf.len = LIST_HEAD;
    }
    else
        PyMem_Free(b->buf);
    b->buf = NULL;
}

/* ``count`` mutations encoded in ``b`` as their list (the header written here). */
static const char *
list_bytes(rs_bytes *b, Py_ssize_t count, Py_ssize_t *len)
{
    if (count == 0) {
        *len = LIST_HEAD;
        return EMPTY_LIST;
    }
    unsigned char *p = (unsigned char *)b->buf;
    uint32_t u = (uint32_t)count;
    p[0] = '[';
    p[1] = (unsigned char)(u & 0xff);
    p[2] = (unsigned char)((u >> 8) & 0xff);
    p[3] = (unsigned char)((u >> 16) & 0xff);
    p[4] = (unsigned char)((u >> 24) & 0xff);
    *len = b->len;
    return b->buf;
}

/* The mutations of ``b`` as the list of tuples the list path makes (``bytes`` where a value was
   an ``array``: its encoding is the same); a new reference, or NULL.

   With the collector off meanwhile: the callers decode mutations they detached from the ledger,
   and making the tuples could otherwise run a collection and so a finalizer that records,
   takes or runs an op while they are in neither the buffer nor ``muts`` (``to_list`` then put
   them back into an op already handed over, or a ``take`` missed them: a seq gap in the
   stream). Only plain values are decoded, so no other Python code runs here. */
static PyObject *
decode(rs_bytes *b, Py_ssize_t count)
{
    Py_ssize_t len;
    const char *data = list_bytes(b, count, &len);
    int was_on = PyGC_Disable();
    PyObject *out = PyMarshal_ReadObjectFromString(data, len);
    if (was_on)
        PyGC_Enable();
    return out;
}

/* The running op goes on in list mode: the buffer's mutations decoded into the front of
   ``muts``, and the rest appended there too, until the op's record is handed over. */
static int
to_list(Ledger *L)
{
    L->listed = 1;
    if (L->mcount == 0)
        return 0;
    rs_bytes b;
    Py_ssize_t count;
    detach(L, &b, &count);
    PyObject *got = decode(&b, count);
    reattach(L, &b);
    if (got == NULL)
        return -1;
    PyObject *muts = Py_NewRef(L->muts);
    int r = PyList_SetSlice(muts, 0, 0, got);
    Py_DECREF(muts);
    Py_DECREF(got);
    return r;
}

/* The exception being raised, taken (a new reference, its traceback attached), and raised
   again (the reference is stolen): Python 3.12's calls, or what they do on older ones. */
static PyObject *
take_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

static void
raise_exception(PyObject *exc)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
#endif
}

/* Make exc the exception being handled (what an ``except`` block sees) while the owner's
   callbacks run; returns what to restore. */
typedef struct { PyObject *t, *v, *tb; } handled_t;
static handled_t
push_handled(PyObject *exc)
{
    handled_t h = {NULL, NULL, NULL};
#if PY_VERSION_HEX >= 0x030B0000
    h.v = PyErr_GetHandledException();
    PyErr_SetHandledException(exc);
#else
    PyErr_GetExcInfo(&h.t, &h.v, &h.tb);
    PyErr_SetExcInfo(Py_NewRef((PyObject *)Py_TYPE(exc)), Py_NewRef(exc),
                     PyException_GetTraceback(exc));
#endif
    return h;
}
static void
pop_handled(handled_t h)
{
#if PY_VERSION_HEX >= 0x030B0000
    PyErr_SetHandledException(h.v);
    Py_XDECREF(h.v);
#else
    PyErr_SetExcInfo(h.t, h.v, h.tb);
#endif
}

/* Call the owner's ``name(*args, error)`` with the raised exception, then raise it again;
   an exception from the call itself replaces it (with the first as its context). */
static void
report_and_reraise(Ledger *L, const char *name, PyObject **args, Py_ssize_t n)
{
    PyObject *exc = take_exception(), *r = NULL;
    handled_t h = push_handled(exc);
    PyObject *cache = owner(L);
    if (cache != NULL) {
        PyObject *meth = PyObject_GetAttrString(cache, name);
        if (meth != NULL) {
            args[n] = exc;
            r = PyObject_Vectorcall(meth, args, n + 1, NULL);
            Py_DECREF(meth);
        }
        Py_DECREF(cache);
    }
    if (r != NULL) {
        Py_DECREF(r);
        pop_handled(h);
        raise_exception(exc);
        return;
    }
    /* the new error was chained to exc by the interpreter when it was raised */
    PyObject *second = take_exception();
    pop_handled(h);
    Py_DECREF(exc);
    raise_exception(second);
}

/* The context getter, the attribute builder or the recorder raised: the owner logs and counts
   an Exception and the op stands; anything else (KeyboardInterrupt) propagates. */
static int
recorder_failed(Ledger *L, PyObject *op)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1; /* KeyboardInterrupt, SystemExit...: PyLedger's except Exception lets them by */
    PyObject *exc = take_exception(), *r = NULL;
    handled_t h = push_handled(exc);
    PyObject *cache = owner(L);
    if (cache != NULL) {
        r = PyObject_CallMethod(cache, "_recorder_failed", "OO", op, exc);
        Py_DECREF(cache);
    }
    if (r == NULL) {
        PyObject *second = take_exception();
        pop_handled(h);
        raise_exception(second);
    }
    else
        pop_handled(h);
    Py_DECREF(exc);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *
context(Ledger *L)
{
    if (L->ctx_var != NULL) {
        PyObject *v;
        if (PyContextVar_Get(L->ctx_var, NULL, &v) < 0)
            return NULL;
        if (v == NULL) /* no value and no default: ContextVar.get() raises LookupError */
            PyErr_SetObject(PyExc_LookupError, L->ctx_var);
        return v;
    }
    if (L->ctx_fn != NULL) {
        PyObject *fn = Py_NewRef(L->ctx_fn), *v = PyObject_CallNoArgs(fn);
        Py_DECREF(fn);
        return v;
    }
    return Py_NewRef(Py_None);
}

static PyObject *
run_plain(Ledger *L, PyObject *op, PyObject *fn, PyObject *const *args, Py_ssize_t n)
{
    L->depth++;
    PyObject *out = PyObject_Vectorcall(fn, args, n, NULL);
    L->depth--;
    if (out == NULL) {
        PyObject *cb[2] = {op, NULL};
        report_and_reraise(L, "_after_error", cb, 1);
    }
    return out;
}

/* The native entry of ``builder``'s type (cache/_builders.h), with its capsule (a new reference)
   in ``*holder``; NULL where it has none (looking it up failed, or raised: cleared; the
   builder is then called as any other). Learned once per type: the last type with a table is
   held, the last without one remembered. */
static const rs_builder_api *
builder_api(Ledger *L, PyObject *builder, PyObject **holder)
{
    PyTypeObject *tp = Py_TYPE(builder);
    if (tp == L->btype) {
        *holder = Py_NewRef(L->bholder);
        return L->bapi;
    }
    if (tp == L->plain_type)
        return NULL;
    Py_INCREF(tp); /* (the lookup may run code that frees it: a metaclass's __getattr__) */
    PyObject *cap = PyObject_GetAttrString((PyObject *)tp, RS_BUILDERS_ATTR);
    const rs_builder_api *api = NULL;
    if (cap == NULL)
        PyErr_Clear();
    else if (PyCapsule_IsValid(cap, RS_BUILDERS_CAPSULE)) {
        api = PyCapsule_GetPointer(cap, RS_BUILDERS_CAPSULE);
        if (api != NULL && api->version != RS_BUILDERS_VERSION)
            api = NULL;
    }
    if (api == NULL) {
        L->plain_type = tp;
        Py_XDECREF(cap);
        Py_DECREF(tp);
        return NULL;
    }
    PyTypeObject *old_type = L->btype;
    PyObject *old_holder = L->bholder;
    L->btype = tp; /* (the reference taken above moves here) */
    L->bholder = Py_NewRef(cap);
    L->bapi = api;
    if (L->plain_type == tp)
        L->plain_type = NULL;
    Py_XDECREF(old_type);
    Py_XDECREF(old_holder);
    *holder = cap;
    return api;
}

/* ``self._attrs[op]`` (a new reference): an exact dict looked up with no code run where ``op``
   is an exact str; else as ``[]`` does it (a subclass's __missing__); KeyError(op). */
static PyObject *
builder_of(PyObject *table, PyObject *op)
{
    if (PyDict_CheckExact(table) && PyUnicode_CheckExact(op)) {
        PyObject *b = PyDict_GetItemWithError(table, op); /* borrowed */
        if (b != NULL)
            return Py_NewRef(b);
        if (PyErr_Occurred())
            return NULL;
    }
    return PyObject_GetItem(table, op);
}

/* ``attrs[op](cache, out, args)`` (a new reference); a builder that raises is the recorder's
   failure, and the record gets ``{}``; NULL when that failure must propagate. A builder with a
   native entry gets the op's arguments as they are; any other the tuple of them. */
static PyObject *
build_attrs(Ledger *L, PyObject *cache, PyObject *op, PyObject *out, PyObject *const *args,
            Py_ssize_t n)
{
    PyObject *attrs = NULL, *argt = NULL, *holder = NULL, *table = Py_NewRef(L->attrs);
    PyObject *builder = builder_of(table, op);
    Py_DECREF(table);
    if (builder != NULL) {
        const rs_builder_api *api = builder_api(L, builder, &holder);
        if (api != NULL)
            attrs = api->build(builder, cache, out, args, n);
        else if ((argt = PyTuple_New(n)) != NULL) {
            for (Py_ssize_t i = 0; i < n; i++)
                PyTuple_SET_ITEM(argt, i, Py_NewRef(args[i]));
            PyObject *bargs[3] = {cache, out, argt};
            attrs = PyObject_Vectorcall(builder, bargs, 3, NULL);
            Py_DECREF(argt);
        }
    }
    Py_XDECREF(holder);
    Py_XDECREF(builder);
    if (attrs == NULL && recorder_failed(L, op) == 0)
        attrs = PyDict_New();
    return attrs;
}

/* The op record as the recorder's call takes it: ``OpRecord``'s 10-tuple, error None. */
static PyObject *
record_tuple(const rs_op_head *h)
{
    PyObject *rec = PyTuple_New(10);
    if (rec == NULL)
        return NULL;
    long long ints[5] = {h->op_id, h->start_ns, h->end_ns, h->seq_first, h->seq_last};
    int at[5] = {0, 2, 3, 6, 7};
    for (int i = 0; i < 5; i++) {
        PyObject *v = PyLong_FromLongLong(ints[i]);
        if (v == NULL) {
            Py_DECREF(rec);
            return NULL;
        }
        PyTuple_SET_ITEM(rec, at[i], v);
    }
    PyTuple_SET_ITEM(rec, 1, Py_NewRef(h->op));
    PyTuple_SET_ITEM(rec, 4, Py_NewRef(h->req_id));
    PyTuple_SET_ITEM(rec, 5, Py_NewRef(h->ctx));
    PyTuple_SET_ITEM(rec, 8, Py_NewRef(h->attrs));
    PyTuple_SET_ITEM(rec, 9, Py_NewRef(Py_None));
    return rec;
}

/* Build the attributes and hand the record over; failures are reported, never raised.
   Direct: the record's fields and its mutations' bytes go to the recorder's ``record`` in one C
   call; where that is not taken, the objects are made (the bytes decoded) and the recorder is
   called with them as on the list path. */
static int
record_op(Ledger *L, PyObject *op, PyObject *out, PyObject *const *args, Py_ssize_t n,
          rs_op_head *h)
{
    /* the op's mutations are taken before the attributes are built: a builder's own go with
       the next op (its seq still counts in this one's seq_last) */
    int direct = writes_direct(L);
    rs_bytes b = {NULL, LIST_HEAD, 0};
    Py_ssize_t count = 0;
    PyObject *muts = NULL;
    if (direct)
        detach(L, &b, &count);
    else {
        PyObject *fresh = PyList_New(0);
        if (fresh == NULL)
            return -1;
        muts = L->muts;
        L->muts = fresh;
    }
    L->listed = 0;
    int rc = -1;
    PyObject *attrs = NULL, *rec = NULL, *cache = owner(L);
    if (cache == NULL || (attrs = build_attrs(L, cache, op, out, args, n)) == NULL)
        goto done;
    h->attrs = attrs;
    h->seq_last = L->seq; /* self.seq, after attrs */
    PyObject *record = Py_NewRef(L->record);
    const rs_direct_api *api = L->api; /* (read after the builder ran: it may __init__ us) */
    PyObject *holder = Py_XNewRef(L->api_holder); /* (the calls below may __init__ us too) */
    int taken = RS_NOT_TAKEN;
    if (direct && api != NULL) {
        Py_ssize_t len;
        const char *data = list_bytes(&b, count, &len);
        taken = api->record(record, h, data, len);
    }
    rc = 0;
    if (taken != RS_DONE) {
        if ((direct && (muts = decode(&b, count)) == NULL) || (rec = record_tuple(h)) == NULL)
            rc = -1;
        else {
            PyObject *rargs[2] = {rec, muts};
            PyObject *r = taken == RS_FAILED ? api->fallback(record, rec, muts)
                                             : PyObject_Vectorcall(record, rargs, 2, NULL);
            if (r != NULL)
                Py_DECREF(r);
            else if (recorder_failed(L, op) < 0)
                rc = -1;
        }
    }
    Py_DECREF(record);
    Py_XDECREF(holder);
done:
    if (direct)
        reattach(L, &b);
    Py_XDECREF(muts);
    Py_XDECREF(attrs);
    Py_XDECREF(rec);
    Py_XDECREF(cache);
    return rc;
}

static PyObject *
ledger_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Ledger *L = (Ledger *)self;
    if (nargs < 3) {
        PyErr_SetString(PyExc_TypeError, "run takes (op, req_id, fn, *args)");
        return NULL;
    }
    PyObject *op = args[0], *req_id = args[1], *fn = args[2];
    PyObject *const *fargs = args + 3;
    Py_ssize_t n = nargs - 3;
    if (L->depth || !L->on)
        return run_plain(L, op, fn, fargs, n);
    L->depth = 1;
    long long op_id = ++L->op_id;
    L->cur_op = op_id;
    PyObject *ctx = context(L);
    if (ctx == NULL) { /* the getter failed: the recorder's failure, not the op's */
        if (recorder_failed(L, op) < 0) {
            L->depth = 0;
            return NULL;
        }
        ctx = Py_NewRef(Py_None);
    }
    long long seq_first = L->seq + 1, start = now_ns();
    PyObject *out = PyObject_Vectorcall(fn, fargs, n, NULL);
    L->depth = 0;
    rs_op_head h = {op_id, start, now_ns(), seq_first, 0, op, req_id, ctx, NULL};
    if (out == NULL) {
        PyObject *cb[9] = {PyLong_FromLongLong(op_id), op, PyLong_FromLongLong(start),
                           PyLong_FromLongLong(h.end_ns), req_id, ctx,
                           PyLong_FromLongLong(seq_first), NULL, NULL};
        if (cb[0] && cb[2] && cb[3] && cb[6])
            report_and_reraise(L, "_op_failed", cb, 7);
        for (int i = 0; i < 7; i++)
            if (i != 1 && i != 4 && i != 5)
                Py_XDECREF(cb[i]);
    }
    else if (record_op(L, op, out, fargs, n, &h) < 0)
        Py_CLEAR(out);
    Py_DECREF(ctx);
    return out;
}

/* Append one mutation (seq, cur_op, kind, node, comp, tier, value); the items are borrowed. */
static int
append_mutation(Ledger *L, PyObject *kind, PyObject *node, PyObject *comp, PyObject *tier,
                PyObject *value)
{
    if (writes_direct(L)) {
        PyObject *items[5] = {kind, node, comp, tier, value};
        int r = L->api->mutation(&L->mbuf, L->seq + 1, L->cur_op, items);
        if (r == RS_DONE) {
            L->mcount++;
            L->seq++;
            return 0;
        }
        if (r < 0)
            return -1;
        /* not plain: this op goes on in list mode (``to_list`` below) */
    }
    PyObject *t = PyTuple_New(7); /* a collection may run: a finalizer that records or takes */
    if (t == NULL)
        return -1;
    /* every mutation of an op shares its op id: one int object for them all (cur_op is
       writable, so the object is checked against it, not trusted) */
    if (L->cur_obj == NULL || L->cur_obj_val != L->cur_op) {
        PyObject *obj = PyLong_FromLongLong(L->cur_op);
        if (obj == NULL) {
            Py_DECREF(t);
            return -1;
        }
        Py_XSETREF(L->cur_obj, obj);
        L->cur_obj_val = L->cur_op;
    }
    PyObject *seq = PyLong_FromLongLong(L->seq + 1), *cur = Py_NewRef(L->cur_obj);
    if (seq == NULL) {
        Py_DECREF(cur);
        Py_DECREF(t);
        return -1;
    }
    PyTuple_SET_ITEM(t, 0, seq);
    PyTuple_SET_ITEM(t, 1, cur);
    PyObject *items[5] = {kind, node, comp, tier, value};
    for (int i = 0; i < 5; i++)
        PyTuple_SET_ITEM(t, 2 + i, Py_NewRef(items[i]));
    /* in direct mode the buffer's mutations go to ``muts`` first, and the op stays in list mode:
       only now, after the allocations above, so that a finalizer's ``take`` or op cannot hand
       ``muts`` over in between and leave this one in a list no record reads (no Python code
       runs from here to the append) */
    if (L->api != NULL && L->direct && to_list(L) < 0) {
        Py_DECREF(t);
        return -1;
    }
    int r = PyList_Append(L->muts, t);
    Py_DECREF(t);
    if (r < 0)
        return -1;
    L->seq++;
    return 0;
}

static PyObject *
ledger_m(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Ledger *L = (Ledger *)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "m takes (kind, node, comp, tier, value)");
        return NULL;
    }
    if (!L->on)
        Py_RETURN_NONE;
    if (append_mutation(L, args[0], args[1], args[2], args[3], args[4]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *s_id, *s_data, *s_values, *s_refs; /* interned attribute names */
enum { H_ID, H_DATA, H_VALUES, H_REFS }; /* their hints in ``Ledger.hints`` */

#define MAX_TIERS 32 /* tiers a component's state is measured on without a list copied */

/* ``v`` (an exact int of 64 bits) into ``*x``: 1, or 0 for anything else (no error set). */
static int
plain_ll(PyObject *v, long long *x)
{
    if (!PyLong_CheckExact(v))
        return 0;
    int overflow;
    *x = PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow; /* (an exact int runs no code and raises nothing here) */
}

/* One component's state ``(lens, refs)`` written by the recorder's ``state`` (no tuple made):
   each tier's measured size in ``lens`` (new references, None where there is no value), the
   refs as ``refs`` holds them. 1 when written, 0 when not plain (a size that is not an exact
   int of 64 bits, refs not an exact list of such ints, an item the recorder cannot write), -1
   with an error set. */
static int
state_direct(Ledger *L, PyObject *const *items, PyObject **lens, Py_ssize_t nt, PyObject *refs)
{
    long long ln[MAX_TIERS], rf[MAX_TIERS];
    rs_state st = {nt, 0, 0, ln, rf};
    for (Py_ssize_t t = 0; t < nt; t++)
        if (lens[t] == Py_None)
            st.none |= (uint32_t)1 << t;
        else if (!plain_ll(lens[t], &ln[t]))
            return 0;
    if (!PyList_CheckExact(refs) || (st.nrefs = PyList_GET_SIZE(refs)) > MAX_TIERS)
        return 0;
    for (Py_ssize_t t = 0; t < st.nrefs; t++)
        if (!plain_ll(PyList_GET_ITEM(refs, t), &rf[t]))
            return 0;
    int r = L->api->state(&L->mbuf, L->seq + 1, L->cur_op, items, &st);
    if (r != RS_DONE)
        return r < 0 ? -1 : 0;
    L->mcount++;
    L->seq++;
    return 1;
}

/* Record one component's state from its data: ``(lens, refs)``, each tier's value (``values``,
   read once) measured by that tier's size callable (None stays None), the refs as a tuple, read
   after the size callables ran (code they run may rebind them, as PyLedger reads them). Tier
   ``hint_tier`` (-1: none) is not measured where the caller gave its value's size, ``hint``
   (the same callable's result, taken as is; a value of None or a hint of None there: the
   value measured or None, as without one). Where the recorder writes directly and all of it
   is plain numbers, ``state_direct`` writes it with no tuple made; else the tuples, as ``m``
   records any value. 0, or -1 with an error set. */
static int
state_record(Ledger *L, PyObject *const *items, PyObject *sizes, PyObject *data,
             PyObject *values, Py_ssize_t hint_tier, PyObject *hint)
{
    Py_ssize_t nt = PyTuple_GET_SIZE(sizes), got;
    PyObject *fast = NULL, *lens[MAX_TIERS], *lent = NULL, *refs = NULL, *value = NULL;
    int r = -1, n = 0;
    /* a list copied first (a size callable may run Python code that changes it): onto the
       stack where it is short, else into a tuple */
    if (PyList_CheckExact(values) && PyList_GET_SIZE(values) == nt && nt <= MAX_TIERS) {
        for (; n < nt; n++)
            lens[n] = Py_NewRef(PyList_GET_ITEM(values, n));
    }
    else {
        if ((fast = PySequence_Tuple(values)) == NULL)
            return -1;
        if ((got = PyTuple_GET_SIZE(fast)) != nt) {
            PyErr_Format(PyExc_ValueError, "state: %zd values for %zd tiers", got, nt);
            goto done;
        }
        if ((lent = PyTuple_New(nt)) == NULL)
            goto done;
    }
    for (Py_ssize_t t = 0; t < nt; t++) { /* each value replaced by its size */
        PyObject *v = fast != NULL ? PyTuple_GET_ITEM(fast, t) : lens[t];
        PyObject *size = v == Py_None ? Py_NewRef(Py_None)
                         : t == hint_tier && hint != Py_None
                             ? Py_NewRef(hint) /* the caller measured this one */
                             : PyObject_CallOneArg(PyTuple_GET_ITEM(sizes, t), v);
        if (size == NULL)
            goto done;
        if (fast != NULL)
            PyTuple_SET_ITEM(lent, t, size);
        else
            Py_SETREF(lens[t], size);
    }
    if ((refs = slot_get(data, s_refs, &L->hints[H_REFS])) == NULL)
        goto done;
    if (!L->on) { /* (recording turned off by code a size callable ran: nothing, as m) */
        r = 0;
        goto done;
    }
    if (fast == NULL && writes_direct(L)) {
        int w = state_direct(L, items, lens, nt, refs);
        if (w != 0) {
            r = w < 0 ? -1 : 0;
            goto done;
        }
    }
    if (lent == NULL) {
        if ((lent = PyTuple_New(nt)) == NULL)
            goto done;
        for (; n > 0; n--)
            PyTuple_SET_ITEM(lent, n - 1, lens[n - 1]); /* the references move to the tuple */
    }
    PyObject *reft = PySequence_Tuple(refs);
    if (reft != NULL) {
        value = PyTuple_Pack(2, lent, reft);
        Py_DECREF(reft);
    }
    if (value != NULL)
        r = append_mutation(L, items[0], items[1], items[2], Py_None, value);
done:
    while (n > 0)
        Py_DECREF(lens[--n]);
    Py_XDECREF(fast);
    Py_XDECREF(lent);
    Py_XDECREF(refs);
    Py_XDECREF(value);
    return r;
}

/* ``v`` as ``operator.index`` takes it (its own error passes through), in [0, n); else -1
   with IndexError("{what} {v!r} out of range"). May run Python code (``__index__``). */
static Py_ssize_t
index_below(PyObject *v, Py_ssize_t n, const char *what)
{
    if (PyLong_CheckExact(v)) { /* the sites' own ints: no call, no reference */
        Py_ssize_t i = PyLong_AsSsize_t(v);
        if (i >= 0 && i < n)
            return i;
        if (i == -1 && PyErr_Occurred())
            PyErr_Clear(); /* (past Py_ssize_t: the error below) */
    }
    PyObject *idx = PyNumber_Index(v);
    if (idx == NULL)
        return -1;
    Py_ssize_t i = PyLong_AsSsize_t(idx);
    Py_DECREF(idx);
    if (i == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
    }
    else if (i >= 0 && i < n)
        return i;
    PyErr_Format(PyExc_IndexError, "%s %R out of range", what, v);
    return -1;
}

static PyObject *
ledger_state(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Ledger *L = (Ledger *)self;
    if (nargs != 2 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "state takes (node, ci) or (node, ci, tier, size)");
        return NULL;
    }
    if (!L->on)
        Py_RETURN_NONE;
    if (L->state_names == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "state: set_states(kind, names, sizes) was not called");
        return NULL;
    }
    /* held before anything runs Python code (``__index__``, a size callable) that may call
       set_states or __init__: this call reads the tables it started with, as PyLedger */
    PyObject *kind = Py_NewRef(L->state_kind), *names = Py_NewRef(L->state_names);
    PyObject *all_sizes = Py_NewRef(L->state_sizes);
    Py_ssize_t ci = index_below(args[1], PyTuple_GET_SIZE(names), "state: component index");
    if (ci < 0) {
        Py_DECREF(kind);
        Py_DECREF(names);
        Py_DECREF(all_sizes);
        return NULL;
    }
    PyObject *name = Py_NewRef(PyTuple_GET_ITEM(names, ci));
    PyObject *sizes = Py_NewRef(PyTuple_GET_ITEM(all_sizes, ci));
    Py_DECREF(names);
    Py_DECREF(all_sizes);
    PyObject *id = NULL, *all = NULL, *data = NULL, *values = NULL, *r = NULL;
    Py_ssize_t hint_tier = -1;
    PyObject *hint = NULL; /* held: code run below may drop the caller's reference */
    if (nargs == 4) {
        hint_tier = index_below(args[2], PyTuple_GET_SIZE(sizes), "state: tier");
        if (hint_tier < 0)
            goto done;
        hint = Py_NewRef(args[3]);
    }
    if ((id = slot_get(args[0], s_id, &L->hints[H_ID])) != NULL
        && (all = slot_get(args[0], s_data, &L->hints[H_DATA])) != NULL
        && (data = PySequence_GetItem(all, ci)) != NULL
        && (values = slot_get(data, s_values, &L->hints[H_VALUES])) != NULL) {
        PyObject *items[3] = {kind, id, name};
        if (state_record(L, items, sizes, data, values, hint_tier, hint) == 0)
            r = Py_NewRef(Py_None);
    }
done:
    Py_XDECREF(hint);
    Py_XDECREF(id);
    Py_XDECREF(all);
    Py_XDECREF(data);
    Py_XDECREF(values);
    Py_DECREF(kind);
    Py_DECREF(name);
    Py_DECREF(sizes);
    return r;
}

static PyObject *
ledger_set_states(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Ledger *L = (Ledger *)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "set_states takes (kind, names, sizes)");
        return NULL;
    }
    PyObject *kind = args[0], *names = args[1], *sizes = args[2];
    /* the checks of ledger.check_states, before anything is kept */
    if (!PyUnicode_Check(kind)) {
        PyErr_Format(PyExc_TypeError, "kind must be a str, got %R", kind);
        return NULL;
    }
    if (!PyTuple_CheckExact(names) || !PyTuple_CheckExact(sizes)
        || PyTuple_GET_SIZE(names) != PyTuple_GET_SIZE(sizes)) {
        PyErr_Format(PyExc_TypeError, "names and sizes must be tuples of one length, got %R and "
                     "%R", names, sizes);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *per_tier = PyTuple_GET_ITEM(sizes, i);
        int ok = PyUnicode_Check(PyTuple_GET_ITEM(names, i)) && PyTuple_CheckExact(per_tier);
        for (Py_ssize_t t = 0; ok && t < PyTuple_GET_SIZE(per_tier); t++)
            ok = PyCallable_Check(PyTuple_GET_ITEM(per_tier, t));
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "component %zd: a str name and a tuple of size "
                         "callables, got %R and %R", i, PyTuple_GET_ITEM(names, i), per_tier);
            return NULL;
        }
    }
    /* all three replaced before any old one is dropped: dropping one may run code (a finalizer)
       that calls state(), which must see three tables that agree */
    PyObject *old[3] = {L->state_kind, L->state_names, L->state_sizes};
    L->state_kind = Py_NewRef(kind);
    L->state_names = Py_NewRef(names);
    L->state_sizes = Py_NewRef(sizes);
    for (int i = 0; i < 3; i++)
        Py_XDECREF(old[i]);
    Py_RETURN_NONE;
}

static PyObject *
ledger_set_pools(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Ledger *L = (Ledger *)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_pools takes (kind, tiers)");
        return NULL;
    }
    PyObject *kind = args[0], *tiers = args[1];
    /* the checks of ledger.check_pools, before anything is kept */
    if (!PyUnicode_Check(kind)) {
        PyErr_Format(PyExc_TypeError, "kind must be a str, got %R", kind);
        return NULL;
    }
    int ok = PyTuple_CheckExact(tiers);
    for (Py_ssize_t t = 0; ok && t < PyTuple_GET_SIZE(tiers); t++)
        ok = PyUnicode_Check(PyTuple_GET_ITEM(tiers, t));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "tiers must be a tuple of str labels, got %R", tiers);
        return NULL;
    }
    PyObject *old[2] = {L->pool_kind, L->pool_tiers}; /* both replaced first, as set_states */
    L->pool_kind = Py_NewRef(kind);
    L->pool_tiers = Py_NewRef(tiers);
    for (int i = 0; i < 2; i++)
        Py_XDECREF(old[i]);
    Py_RETURN_NONE;
}

/* ``m(pool_kind, None, names[ci], tiers[tier], available)``: a pool's new free count, with
   the names set_states and set_pools gave; no Python frame at the cache's alloc and free. */
static PyObject *
ledger_pool(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Ledger *L = (Ledger *)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "pool takes (ci, tier, available)");
        return NULL;
    }
    if (!L->on)
        Py_RETURN_NONE;
    if (L->pool_kind == NULL || L->state_names == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "pool: set_pools(kind, tiers) and set_states(kind, names, sizes) were "
                        "not both called");
        return NULL;
    }
    /* held before ``__index__`` runs (it may call set_pools, set_states or __init__): this
       call reads the tables it started with, as PyLedger */
    PyObject *kind = Py_NewRef(L->pool_kind), *names = Py_NewRef(L->state_names);
    PyObject *tiers = Py_NewRef(L->pool_tiers), *name = NULL, *label = NULL;
    Py_ssize_t ci = index_below(args[0], PyTuple_GET_SIZE(names), "pool: component index");
    Py_ssize_t t = ci < 0 ? -1 : index_below(args[1], PyTuple_GET_SIZE(tiers), "pool: tier");
    if (t >= 0) {
        name = Py_NewRef(PyTuple_GET_ITEM(names, ci));
        label = Py_NewRef(PyTuple_GET_ITEM(tiers, t));
    }
    Py_DECREF(names);
    Py_DECREF(tiers);
    if (t < 0) {
        Py_DECREF(kind);
        return NULL;
    }
    /* (recording turned off by code ``__index__`` ran: nothing recorded, as m) */
    int r = L->on ? append_mutation(L, kind, Py_None, name, label, args[2]) : 0;
    Py_DECREF(kind);
    Py_DECREF(name);
    Py_DECREF(label);
    if (r < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
ledger_take(PyObject *self, PyObject *Py_UNUSED(unused))
{
    Ledger *L = (Ledger *)self;
    L->listed = 0;
    if (L->mcount) { /* direct: the buffer decoded */
        rs_bytes b;
        Py_ssize_t count;
        detach(L, &b, &count);
        PyObject *got = decode(&b, count);
        reattach(L, &b);
        return got;
    }
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL)
        return NULL;
    PyObject *muts = L->muts;
    L->muts = fresh;
    return muts;
}

static PyMethodDef ledger_methods[] = {
    {"run", (PyCFunction)(void (*)(void))ledger_run, METH_FASTCALL,
     "run(op, req_id, fn, *args): fn(*args), recorded at the top level when on."},
    {"m", (PyCFunction)(void (*)(void))ledger_m, METH_FASTCALL,
     "m(kind, node, comp, tier, value): number one state change and keep it."},
    {"state", (PyCFunction)(void (*)(void))ledger_state, METH_FASTCALL,
     "state(node, ci[, tier, size]): one component's state on a node, numbered and kept (see "
     "set_states); ``size``: the value on ``tier`` as its size callable measured it (not "
     "measured again)."},
    {"set_states", (PyCFunction)(void (*)(void))ledger_set_states, METH_FASTCALL,
     "set_states(kind, names, sizes): the mutation kind, component names and per-tier size "
     "callables state() uses."},
    {"pool", (PyCFunction)(void (*)(void))ledger_pool, METH_FASTCALL,
     "pool(ci, tier, available): a pool's free count, numbered and kept (see set_pools)."},
    {"set_pools", (PyCFunction)(void (*)(void))ledger_set_pools, METH_FASTCALL,
     "set_pools(kind, tiers): the mutation kind and tier labels pool() uses."},
    {"take", ledger_take, METH_NOARGS, "take(): the mutations kept so far (a fresh list follows)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef ledger_members[] = {
    {"seq", T_LONGLONG, offsetof(Ledger, seq), 0, "the last state change's number"},
    {"op_id", T_LONGLONG, offsetof(Ledger, op_id), 0, "the last op id handed out"},
    {"cur_op", T_LONGLONG, offsetof(Ledger, cur_op), 0, "the op running now (or last run)"},
    {"depth", T_LONGLONG, offsetof(Ledger, depth), 0, "nesting of the running op"},
    {"on", T_BOOL, offsetof(Ledger, on), 0, "recording"},
    {NULL, 0, 0, 0, NULL},
};

/* The list itself, as on the list path: the op goes on in list mode (what is appended to it
   is the op's, until its record is handed over). */
static PyObject *
ledger_get_muts(PyObject *self, void *Py_UNUSED(closure))
{
    Ledger *L = (Ledger *)self;
    if (to_list(L) < 0)
        return NULL;
    return Py_NewRef(L->muts);
}

static int
ledger_set_muts(PyObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    Ledger *L = (Ledger *)self;
    if (value == NULL || !PyList_CheckExact(value)) {
        PyErr_Format(PyExc_TypeError, "muts must be a list, got %R", value);
        return -1;
    }
    L->mcount = 0; /* replaced, as the list is */
    L->mbuf.len = LIST_HEAD;
    L->listed = 1;
    Py_SETREF(L->muts, Py_NewRef(value));
    return 0;
}

static PyObject *
ledger_get_direct(PyObject *self, void *Py_UNUSED(closure))
{
    Ledger *L = (Ledger *)self;
    return PyBool_FromLong(L->direct && L->api != NULL);
}

static int
ledger_set_direct(PyObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    Ledger *L = (Ledger *)self;
    int on = value == NULL ? -1 : PyObject_IsTrue(value);
    if (on < 0) {
        if (value == NULL)
            PyErr_SetString(PyExc_TypeError, "direct cannot be deleted");
        return -1;
    }
    if (!on && L->mcount && to_list(L) < 0) /* the op's mutations so far, as lists have them */
        return -1;
    if (on && !L->direct) /* after mutations in the list: direct from the next op */
        L->listed = PyList_GET_SIZE(L->muts) > 0;
    L->direct = on;
    return 0;
}

static PyGetSetDef ledger_getset[] = {
    {"muts", ledger_get_muts, ledger_set_muts, "the running op's mutations", NULL},
    {"direct", ledger_get_direct, ledger_set_direct,
     "records go straight to the recorder (cache/_direct.h): True where it allows it and this "
     "was not set False", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static int
ledger_init(PyObject *self, PyObject *args, PyObject *kwds)
{
    Ledger *L = (Ledger *)self;
    static char *kw[] = {"cache", "record", "context", "attrs", "on", NULL};
    PyObject *cache, *record, *ctx, *attrs;
    int on;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOp:Ledger", kw, &cache, &record, &ctx,
                                     &attrs, &on))
        return -1;
    /* the checks of ledger.check_args, before anything is kept */
    if (!PyCallable_Check(record)) {
        PyErr_Format(PyExc_TypeError, "record must be callable, got %R", record);
        return -1;
    }
    if (ctx != Py_None && !PyContextVar_CheckExact(ctx) && !PyCallable_Check(ctx)) {
        PyErr_Format(PyExc_TypeError, "context must be a ContextVar, a callable or None, got %R",
                     ctx);
        return -1;
    }
    if (!PyDict_Check(attrs)) {
        PyErr_Format(PyExc_TypeError, "attrs must be a dict of op -> attribute builder, got %R",
                     attrs);
        return -1;
    }
    const rs_direct_api *api;
    PyObject *holder;
    if (find_api(record, &api, &holder) < 0)
        return -1;
    PyObject *ref = PyWeakref_NewRef(cache, NULL), *muts = PyList_New(0);
    if (ref == NULL || muts == NULL) {
        Py_XDECREF(ref);
        Py_XDECREF(muts);
        Py_XDECREF(holder);
        return -1;
    }
    Py_XSETREF(L->cache, ref);
    Py_XSETREF(L->muts, muts);
    Py_XSETREF(L->record, Py_NewRef(record));
    Py_CLEAR(L->ctx_var);
    Py_CLEAR(L->ctx_fn);
    if (PyContextVar_CheckExact(ctx))
        L->ctx_var = Py_NewRef(ctx);
    else if (ctx != Py_None)
        L->ctx_fn = Py_NewRef(ctx);
    Py_XSETREF(L->attrs, Py_NewRef(attrs));
    Py_CLEAR(L->state_kind); /* set_states again, as PyLedger.__init__ forgets them */
    Py_CLEAR(L->state_names);
    Py_CLEAR(L->state_sizes);
    Py_CLEAR(L->pool_kind);
    Py_CLEAR(L->pool_tiers);
    L->on = on;
    L->seq = L->op_id = L->cur_op = L->depth = 0;
    L->api = api;
    Py_XSETREF(L->api_holder, holder);
    L->direct = 1;
    L->listed = 0;
    L->mcount = 0; /* dropped, as the list is */
    L->mbuf.len = LIST_HEAD;
    return 0;
}

static PyObject *
ledger_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwds))
{
    Ledger *L = (Ledger *)type->tp_alloc(type, 0);
    if (L == NULL)
        return NULL;
    L->mbuf.len = LIST_HEAD;
    L->direct = 1;
    if ((L->muts = PyList_New(0)) == NULL)
        Py_CLEAR(L);
    return (PyObject *)L;
}

static int
ledger_traverse(PyObject *self, visitproc visit, void *arg)
{
    Ledger *L = (Ledger *)self;
    Py_VISIT(L->muts);
    Py_VISIT(L->cache);
    Py_VISIT(L->record);
    Py_VISIT(L->api_holder);
    Py_VISIT(L->ctx_var);
    Py_VISIT(L->ctx_fn);
    Py_VISIT(L->attrs);
    Py_VISIT(L->state_kind);
    Py_VISIT(L->state_names);
    Py_VISIT(L->state_sizes);
    Py_VISIT(L->pool_kind);
    Py_VISIT(L->pool_tiers);
    Py_VISIT(L->cur_obj);
    Py_VISIT(L->btype);
    Py_VISIT(L->bholder);
    return 0;
}

static int
ledger_clear(PyObject *self)
{
    Ledger *L = (Ledger *)self;
    Py_CLEAR(L->cache);
    Py_CLEAR(L->record);
    Py_CLEAR(L->api_holder);
    L->api = NULL;
    Py_CLEAR(L->ctx_var);
    Py_CLEAR(L->ctx_fn);
    Py_CLEAR(L->attrs);
    Py_CLEAR(L->state_kind);
    Py_CLEAR(L->state_names);
    Py_CLEAR(L->state_sizes);
    Py_CLEAR(L->pool_kind);
    Py_CLEAR(L->pool_tiers);
    Py_CLEAR(L->cur_obj);
    Py_CLEAR(L->bholder);
    L->bapi = NULL;
    Py_CLEAR(L->btype);
    /* muts stays a list: every method may rely on it */
    return 0;
}

static void
ledger_dealloc(PyObject *self)
{
    Ledger *L = (Ledger *)self;
    PyObject_GC_UnTrack(self);
    if (L->weakreflist != NULL)
        PyObject_ClearWeakRefs(self);
    ledger_clear(self);
    Py_CLEAR(L->muts);
    PyMem_Free(L->mbuf.buf);
    Py_TYPE(self)->tp_free(self);
}

static PyTypeObject LedgerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "radixscope.cache._ledger.Ledger",
    .tp_doc = "Ledger(cache, record, context, attrs, on): see cache/ledger.py.",
    .tp_basicsize = sizeof(Ledger),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = ledger_new,
    .tp_init = ledger_init,
    .tp_traverse = ledger_traverse,
    .tp_clear = ledger_clear,
    .tp_dealloc = ledger_dealloc,
    .tp_weaklistoffset = offsetof(Ledger, weakreflist),
    .tp_methods = ledger_methods,
    .tp_members = ledger_members,
    .tp_getset = ledger_getset,
};

static struct PyModuleDef ledger_module = {
    PyModuleDef_HEAD_INIT, "radixscope.cache._ledger",
    "The cache's ledger in C; see cache/ledger.py.", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__ledger(void)
{
    if (PyType_Ready(&LedgerType) < 0)
        return NULL;
    if ((s_id = PyUnicode_InternFromString("id")) == NULL
        || (s_data = PyUnicode_InternFromString("data")) == NULL
        || (s_values = PyUnicode_InternFromString("values")) == NULL
        || (s_refs = PyUnicode_InternFromString("refs")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&ledger_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI", LEDGER_ABI) < 0
        || PyModule_AddObjectRef(m, "Ledger", (PyObject *)&LedgerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
