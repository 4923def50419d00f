/* Native attribute builders: the C entry through which the cache's ledger (``cache/_ledger.c``)
   calls a ``native.Fields`` builder (``cache/_native.c``) with the op's arguments as it has them,
   a vector, where a Python call would take them as a tuple made for the call.

   The ledger calls ``attrs[op](cache, out, args)``, ``args`` the tuple of the arguments the
   op's implementation ran with. Where the builder's type carries a capsule named
   ``RS_BUILDERS_CAPSULE`` in its attribute ``RS_BUILDERS_ATTR`` holding an ``rs_builder_api``
   of ``RS_BUILDERS_VERSION``, the ledger calls ``build`` instead: the same result, and the same
   errors, as that call, with no tuple made unless the builder needs one (a fallback of its
   own, an argument read from something other than the vector). The two modules are built
   apart; each finds the other's table on the objects it is given, and without one runs as
   before. A change to this file changes ``RS_BUILDERS_VERSION``. */

#ifndef RADIXSCOPE_BUILDERS_H
#define RADIXSCOPE_BUILDERS_H

#include <Python.h>

#define RS_BUILDERS_CAPSULE "radixscope.builder_api"
#define RS_BUILDERS_ATTR "_radixscope_builder_api"
#define RS_BUILDERS_VERSION 1

typedef struct {
    int version; /* RS_BUILDERS_VERSION */
    /* ``builder(cache, out, tuple(args[0..n]))``: a new reference, or NULL with an error set.
       ``builder`` is of the type whose capsule held this table; the items are borrowed. */
    PyObject *(*build)(PyObject *builder, PyObject *cache, PyObject *out, PyObject *const *args,
                       Py_ssize_t n);
} rs_builder_api;

#endif
