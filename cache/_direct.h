/* Direct records: the C interface through which the cache's ledger (``cache/_ledger.c``) hands
   an op's record straight to a native recorder, with no Python object made per mutation or per
   op record.

   The ledger calls ``record(op_record, mutations)``; when that callable's type carries a capsule
   named ``RS_DIRECT_CAPSULE`` in its attribute ``RS_DIRECT_ATTR`` holding an ``rs_direct_api``
   of ``RS_DIRECT_VERSION`` (telemetry's ``Sink``, ``telemetry/record/_sink.c``), the ledger
   encodes each mutation into a buffer of its own as it is made (``mutation``) and hands the
   finished record over in one call (``record``). The cache never imports telemetry: it finds the
   table on the recorder it was given, and without one runs as before. Both sides include this
   file; a change to it changes ``RS_DIRECT_VERSION``.

   Encodings are marshal's version 2 (what ``marshal.dumps(x, 2)`` writes), so a buffer of
   mutations is read back with ``marshal.loads`` and concatenates with the recorder's own. */

#ifndef RADIXSCOPE_DIRECT_H
#define RADIXSCOPE_DIRECT_H

#include <Python.h>
#include <stdint.h>

#define RS_DIRECT_CAPSULE "radixscope.direct_api"
#define RS_DIRECT_ATTR "_radixscope_direct_api"
#define RS_DIRECT_VERSION 2

/* A byte buffer its owner frees with PyMem_Free; ``mutation`` grows it with PyMem_Realloc. */
typedef struct {
    char *buf;
    Py_ssize_t len, cap;
} rs_bytes;

/* One component's state on a node, the value ``(lens, refs)`` of the cache's ``comp.state``
   mutations, as plain numbers: ``lens[t]`` each tier's measured size (None where bit ``t`` of
   ``none`` is set), then the refs. At most 32 tiers. */
typedef struct {
    Py_ssize_t ntiers, nrefs;
    uint32_t none;
    const long long *lens, *refs;
} rs_state;

/* An op record's fields (``OpRecord``'s order, less ``error``: None), the objects borrowed. */
typedef struct {
    long long op_id, start_ns, end_ns, seq_first, seq_last;
    PyObject *op, *req_id, *ctx, *attrs;
} rs_op_head;

enum {
    RS_DONE = 0,       /* written, or taken */
    RS_NOT_PLAIN = 1,  /* mutation: a value it cannot write without running Python code */
    RS_NOT_TAKEN = 2,  /* record: call the recorder with the record's objects, as without this */
    RS_FAILED = 3,     /* record: it could not be encoded: hand the objects to ``fallback`` */
};

typedef struct {
    int version;  /* RS_DIRECT_VERSION */
    /* Append the mutation ``(seq, cur_op, items[0..4])`` (kind, node, comp, tier, value) as
       marshal writes that 7-tuple. RS_DONE; RS_NOT_PLAIN with ``out`` as it was and no error
       set, for anything but None, bools, exact ints of 64 bits, exact strs (no lone
       surrogate), bytes, ``array.array`` and exact tuples, lists and dicts of those, nested at
       most as deep as the recorder writes itself (no Python code runs, so nothing can change
       while it is written); -1 with an error set (memory), ``out`` as it was. */
    int (*mutation)(rs_bytes *out, long long seq, long long cur_op, PyObject *const *items);
    /* Append ``(seq, cur_op, items[0], items[1], items[2], None, (lens, refs))`` (kind, node,
       comp; no tier; ``st`` as its tuples of ints and None) as ``mutation`` writes that 7-tuple
       made of objects: the ledger's ``state``, with no tuple made. The returns of ``mutation``
       (RS_NOT_PLAIN: an item it cannot write). */
    int (*state)(rs_bytes *out, long long seq, long long cur_op, PyObject *const *items,
                 const rs_state *st);
    /* Append the record ``head`` with its mutations, ``muts`` (``len`` bytes: marshal's
       encoding of their list, header included) to ``recorder``'s buffer. RS_DONE; RS_NOT_TAKEN
       where the recorder, called with the objects, would not append it itself (its buffer is at
       its limit, it is busy, it is not the capsule's type); RS_FAILED where the append failed
       (the recorder's parent lookup or an attribute's encoding), the buffer as it was. No error
       is set on return: every failure is one of these, as the recorder's own call handles them.
       Python code may run (the parent lookup, marshal's writer on an odd attribute). */
    int (*record)(PyObject *recorder, const rs_op_head *head, const char *muts, Py_ssize_t len);
    /* What the recorder does with a record it could not append: its ``fallback(op, muts)``. */
    PyObject *(*fallback)(PyObject *recorder, PyObject *op, PyObject *muts);
} rs_direct_api;

#endif
