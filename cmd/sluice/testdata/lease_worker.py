"""A processor of TestPythonLeases: it holds capacity leases of a service
through sluice serve (clients/python/sluice.py's LeaseHolder) and sends its
records to a throttled stub at the granted rate, each until accepted.

    lease_worker.py BASE TOKEN SERVICE NAME RECORDS STUB CAPACITY PARTITIONS TTL

It prints READY, starts on a line from stdin, and prints
"DONE NAME THROTTLED" when every record was accepted, THROTTLED being the
429s it met.

    lease_worker.py check BASE TOKEN

checks, for TestPythonLeaseClient, the client's errors against a serve
started with --coord-max-holders 1, and the Pacer's promises; it prints
"check ok" or fails.
"""

import collections
import http.client
import sys
import threading
import time
import urllib.parse

import sluice

# Requests in flight: enough that a stub slowed by a loaded machine (the
# test's, under the race detector) does not bound the rate below the
# grant's (16 fell to about 225/s of 245 under load).
WORKERS = 48


def main():
    base, token, service, name, records, stub, capacity, partitions, ttl = sys.argv[1:10]
    records, capacity, partitions, ttl = int(records), float(capacity), int(partitions), float(ttl)
    stub = urllib.parse.urlsplit(stub)
    queue = collections.deque(range(records))
    cond = threading.Condition()
    state = {"left": records, "throttled": 0}
    holder = sluice.LeaseHolder(base, service, capacity, partitions, ttl=ttl, token=token)

    def backlog():
        with cond:
            return 0.0, state["left"]

    def work():
        conn = http.client.HTTPConnection(stub.hostname, stub.port, timeout=10)
        while True:
            with cond:
                while not queue and state["left"] > 0:
                    cond.wait()
                if state["left"] == 0:
                    return
                rec = queue.popleft()
            if not holder.pacer.acquire(timeout=30):
                raise SystemExit(f"{name}: no capacity within 30 s")
            status = 0
            try:
                conn.request("GET", f"/?c={name}&r={rec}")
                resp = conn.getresponse()
                resp.read()
                status = resp.status
            except OSError:
                conn.close()
                conn = http.client.HTTPConnection(stub.hostname, stub.port, timeout=10)
            with cond:
                if status == 200:
                    state["left"] -= 1
                    if state["left"] == 0:
                        cond.notify_all()
                else:
                    if status == 429:
                        state["throttled"] += 1
                    queue.append(rec)
                    cond.notify()

    print("READY", flush=True)
    sys.stdin.readline()
    with holder.run(demand=backlog, beat=ttl / 4):
        threads = [threading.Thread(target=work) for _ in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print(f"DONE {name} {state['throttled']}", flush=True)


def check(base, token):
    def raises(exc, f):
        try:
            f()
        except exc:
            return
        raise AssertionError(f"{f} did not raise {exc.__name__}")

    # Errors: bounds, a third... second holder, made-up and ended ids, no token.
    raises(sluice.BadRequest, lambda: sluice.LeaseHolder(base, "py-check", 0, 4, token=token).join())
    raises(sluice.Unauthorized, lambda: sluice.LeaseHolder(base, "py-check", 100, 4).join())
    h = sluice.LeaseHolder(base, "py-check", 100, 4, ttl=1, token=token)
    g = h.join(backlog=10)
    assert g.version == 1 and g.rate == 0 and not g.valid(), g
    raises(sluice.TooManyHolders, lambda: sluice.LeaseHolder(base, "py-check", 100, 4, token=token).join())
    for _ in range(20):
        g = h.watch(wait=1)
        if g.rate == 100:
            break
    assert g.rate == 100 and len(g.leases) == 4 and g.valid() and g.valid_until <= time.monotonic() + 1, g
    assert "holder_id" not in repr(g) and g.holder_id not in repr(g), "a grant's repr shows the holder id"
    g = h.demand(backlog=10)
    assert g.rate == 100, g
    other = sluice.LeaseHolder(base, "py-check", 100, 4, token=token)
    other.grant = sluice.LeaseGrant(dict(holder_id="A" * 26, version=1, rate=0, pace_rate=0, burst=0,
                                         window_ms=1000, valid_for_ms=0, leases=[]), time.monotonic())
    raises(sluice.HolderLost, lambda: other.demand())
    h.leave()
    raises(sluice.HolderLost, lambda: h.demand())

    # The Pacer: capacity starts empty, nothing after the validity, a
    # burst that grows gives no tokens.
    p = sluice.Pacer()
    now = time.monotonic()
    grant = sluice.LeaseGrant(dict(holder_id="A" * 26, version=2, rate=100, pace_rate=100, burst=1,
                                   window_ms=1000, valid_for_ms=300, leases=[]), now)
    p.update(grant)
    assert not p.acquire(timeout=0), "a new grant's bucket was not empty"
    taken, last = 0, None
    while p.acquire(timeout=0.5):
        taken += 1
        last = time.monotonic()
    assert last is not None and last < grant.valid_until, (last, grant.valid_until)
    assert 20 <= taken <= 31, f"{taken} tokens in 300 ms at 100/s with a burst of 1"
    assert time.monotonic() >= grant.valid_until
    now = time.monotonic()
    p.update(sluice.LeaseGrant(dict(holder_id="A" * 26, version=3, rate=100, pace_rate=100, burst=50,
                                    window_ms=1000, valid_for_ms=5000, leases=[]), now))
    assert not p.acquire(n=2, timeout=0), "a larger burst gave tokens at once"
    p.close()
    assert not p.acquire(timeout=5), "a closed pacer let a caller through"
    check_catchup()
    print("check ok", flush=True)


def check_catchup():
    """The Pacer lets a stalled sender catch up, within its catchup and
    within the window's credit, also across a change of rate."""
    def grant(version, rate, pace, valid=10000):
        return sluice.LeaseGrant(dict(holder_id="A" * 26, version=version, rate=rate, pace_rate=pace, burst=1,
                                      window_ms=1000, valid_for_ms=valid, leases=[]), time.monotonic())

    def take(p, secs):
        sent, end = [], time.monotonic() + secs
        while time.monotonic() < end:
            if p.acquire(timeout=max(end - time.monotonic(), 0)):
                sent.append(time.monotonic())
        return sent

    # After a stall of 200 ms at 99/s, what it earned goes too, at twice
    # the pace (a bucket of burst 1 would give about 20 in the next 200
    # ms); after a longer one, a quarter window's worth.
    p = sluice.Pacer()
    p.update(grant(1, 100, 99))
    time.sleep(0.2)
    n = len(take(p, 0.2))
    assert 35 <= n <= 42, f"{n} units in 200 ms after a stall of 200 ms at 99/s"
    time.sleep(0.8)
    n = len(take(p, 0.4))
    assert 58 <= n <= 68, f"{n} units in 400 ms after a stall of 800 ms, catchup 250 ms at 99/s"

    # Catching up never puts more in a window than the schedule's share
    # of the credit: 1.5 s earned, 99 of a window's 100 sent. Then the rate halves (share 50/s): every
    # window ending at a send holds no more than the capacity held over
    # it, the old rate and the new pro rata.
    p = sluice.Pacer(catchup=5)
    t0 = time.monotonic()
    p.update(grant(2, 100, 99))
    time.sleep(1.5)
    sent = take(p, 0.6)
    assert 95 <= len(sent) <= 99, f"{len(sent)} units in a window of credit 100 at 99/s"
    sent += take(p, 0.2)
    changed = time.monotonic()
    p.update(grant(3, 50, 49.5))
    sent += take(p, 1.3)

    def credit(t):
        lo = t - 1
        return 100 * max(0, min(changed, t) - max(t0, lo)) + 50 * max(0, t - max(changed, lo))

    for i, t in enumerate(sent):
        k = sum(1 for u in sent[:i + 1] if u > t - 1)
        assert k <= credit(t) + 1, f"{k} units in the window ending {t - t0:.3f} s, credit {credit(t):.1f}"
    late = [t for t in sent if t > changed]
    # A floor, loose for a loaded machine (a late wake-up sends less);
    # the ceilings above are the promise.
    assert len(late) >= 45, f"{len(late)} units in 1.3 s after the rate fell to 50/s"


if __name__ == "__main__":
    if sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        main()
