"""What a request's key costs to build (``TokenKey``, or the validation ``match_prefix`` and
``insert`` run on a key that is not one), per container an engine may hold its token ids in.

Chat-shaped keys (``--tokens`` ids drawn from a 32 k vocabulary, default 2,000: a request of
the issue-17 workload). Each container is timed the way the cache takes it now and, as the
in-process baseline, item by item as it was taken before (a tensor through ``tolist()``, an
``array`` of another typecode through ``array('Q', a)``, a numpy array through ``tolist()``:
the cache refused those); a list has one way only and is the reference row. Medians of
``--reps`` rounds of ``timeit``, us per key.

    python bench/bench_keys.py
    python bench/bench_keys.py --tokens 16000
"""

from __future__ import annotations

import argparse
import random
import statistics
import timeit
from array import array

import numpy as np
import torch

from radixscope.cache.keys import KEY_TYPECODE, TokenKey


def _us(fn, number: int, reps: int) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=reps)) / number * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(0)
    ints = [rng.randrange(1, 32000) for _ in range(args.tokens)]
    number = max(20, 400_000 // max(1, args.tokens))
    forms = {
        "list": (ints, None),
        "array('i')": (array("i", ints), lambda k: array(KEY_TYPECODE, k)),
        "numpy int64": (np.array(ints, dtype=np.int64), lambda k: array(KEY_TYPECODE, k.tolist())),
        "numpy int32": (np.array(ints, dtype=np.int32), lambda k: array(KEY_TYPECODE, k.tolist())),
        "tensor int64": (torch.tensor(ints), lambda k: array(KEY_TYPECODE, k.tolist())),
        "tensor int32": (torch.tensor(ints, dtype=torch.int32),
                         lambda k: array(KEY_TYPECODE, k.tolist())),
    }
    print(f"TokenKey of {args.tokens} tokens, us per key (median of {args.reps} x {number})")
    print(f"{'container':>14} {'item by item':>13} {'now':>8} {'now / item by item':>19}")
    for name, (key, before) in forms.items():
        now = _us(lambda k=key: TokenKey(k), number, args.reps)
        if before is None:
            print(f"{name:>14} {'':>13} {now:8.2f} {'':>19}")
            continue
        assert array(KEY_TYPECODE, TokenKey(key).tokens) == before(key)
        old = _us(lambda k=key, f=before: f(k), number, args.reps)
        print(f"{name:>14} {old:13.2f} {now:8.2f} {now / old:19.3f}")


if __name__ == "__main__":
    main()
