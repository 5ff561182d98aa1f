"""A worker of TestPythonPacing, using clients/python/sluice.py.

    reserve_worker.py BASE_URL STUB COUNT

COUNT times: pace on domain "py", descriptor job=shared, cost 1 (waiting
up to 2 s), then POST to STUB. It prints "done REFUSED" with the number
of 429s the stub answered, and exits 0; 1 with the reason on stderr when
anything else failed. Every error answer of serve is checked too, once:
a window limit is BadRequest, a cost above the capacity OverLimit with
retry_after inf. Then a check reserving 100 tokens of an hourly window
of 100 is settled at 40: 60 come back, once (a repeat is
already_settled, an unknown id UnknownReservation).
"""

import math
import os
import sys
import urllib.error
import urllib.request

import sluice


def main():
    base, stub, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    limits = sluice.RateLimits(base)
    try:
        limits.reserve("py", [{"win": "x"}], max_wait=1)
        raise SystemExit("a window limit was reserved")
    except sluice.BadRequest as e:
        if "cannot be reserved" not in e.detail:
            raise SystemExit(f"window limit: {e}")
    try:
        limits.reserve("py", [[("job", "other")]], cost=1000, max_wait=1)
        raise SystemExit("a cost above the capacity was reserved")
    except sluice.OverLimit as e:
        if not math.isinf(e.retry_after):
            raise SystemExit(f"above the capacity: retry_after {e.retry_after}")
    settle(limits)
    refused = 0
    for _ in range(count):
        limits.pace("py", [{"job": "shared"}], cost=1, max_wait=2)
        req = urllib.request.Request(stub, data=b"x", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                resp.read()
        except urllib.error.HTTPError as e:
            e.close()
            if e.code != 429:
                raise
            refused += 1
    print(f"done {refused}", flush=True)


def settle(limits):
    tokens = [{"tokens": str(os.getpid())}]  # a key of this worker's own
    first = limits.check("py", tokens, costs={"tokens": 100}, settle=True, settle_within=60)
    if not first["allowed"] or not first.get("reservation"):
        raise SystemExit(f"check with settle: {first}")
    if limits.check("py", tokens, costs={"tokens": 1})["allowed"]:
        raise SystemExit("a token past the window's 100 was admitted")
    got = limits.settle(first["reservation"], costs={"tokens": 40})
    if not got["settled"] or got["refunded"] != 60:
        raise SystemExit(f"settle at 40: {got}")
    if not limits.check("py", tokens, costs={"tokens": 60})["allowed"]:
        raise SystemExit("the 60 tokens settled back were not admitted")
    if not limits.settle(first["reservation"], costs={"tokens": 40})["already_settled"]:
        raise SystemExit("a repeated settlement was not already_settled")
    try:
        limits.settle("AAAAAAAAAAAAAAAAAAAAAA", cost=1)
        raise SystemExit("an unknown reservation was settled")
    except sluice.UnknownReservation:
        pass


if __name__ == "__main__":
    main()
