"""A worker of TestPythonClient, using clients/python/sluice.py.

    semaphore_worker.py MODE BASE_URL TOKEN NAME LIMIT TTL [ARGS...]

It reports on stdout, one line per event, which the test reads to
synchronise; it exits 0 when all went as expected, 1 with the reason on
stderr otherwise.

Modes:
  work ID STUB ROUNDS REQUESTS  ROUNDS times: hold a permit and send
                                REQUESTS POSTs to STUB with its fence;
                                then print "done ID".
  hold STUB                     hold a permit, send one request with its
                                fence, print "holding FENCE", and wait
                                for stdin to close (the test kills it).
  take STUB WAIT                print "waiting", acquire (waiting up to
                                WAIT s), send one request with its fence,
                                print "acquired FENCE STATUS", release.
  errors                        each error answer raises its exception;
                                holders lists the permit, is_held tells;
                                hold renews past the TTL and releases;
                                print "errors ok".
  crowd WAITERS                 one acquire beyond WAITERS waiting is
                                refused (429), print "crowded"; the
                                waiters get 503 when serve stops; print
                                "unavailable ok".
"""

import sys
import threading
import time
import urllib.error
import urllib.request

import sluice


def send(stub, permit, worker=""):
    req = urllib.request.Request(stub, data=b"{}", method="POST")
    permit.set_fence(req.headers)
    if worker:
        req.headers["X-Worker"] = worker
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        e.close()
        return e.code


def say(line):
    print(line, flush=True)


def fail(reason):
    print(reason, file=sys.stderr, flush=True)
    sys.exit(1)


def expect(exc, call):
    try:
        call()
    except exc as e:
        if not e.detail:
            fail(f"{exc.__name__} without a detail")
        return
    except sluice.SluiceError as e:
        fail(f"{e!r}, want {exc.__name__}")
    fail(f"no {exc.__name__}")


def main(mode, base_url, token, name, limit, ttl, *args):
    sem = sluice.Semaphore(base_url, name, int(limit), ttl=float(ttl), token=token, timeout=10)
    if mode == "work":
        worker, stub, rounds, requests = args[0], args[1], int(args[2]), int(args[3])
        for _ in range(rounds):
            with sem.hold(wait=8) as permit:
                for _ in range(requests):
                    if not permit.valid():
                        fail(f"permit {permit!r} no longer valid while held")
                    status = send(stub, permit, worker)
                    if status != 200:
                        fail(f"the protected service answered {status}")
        say(f"done {worker}")
    elif mode == "hold":
        with sem.hold() as permit:
            status = send(args[0], permit)
            if status != 200:
                fail(f"the protected service answered {status}")
            say(f"holding {permit.fence}")
            sys.stdin.read()
    elif mode == "take":
        say("waiting")
        with sem.hold(wait=float(args[1])) as permit:
            say(f"acquired {permit.fence} {send(args[0], permit)}")
    elif mode == "errors":
        permit = sem.acquire()
        if not permit.valid() or permit.fence < 1 or len(permit.permit_id) != 26:
            fail(f"odd grant {permit!r}")
        listing = sem.holders()
        if [h["fence"] for h in listing["holders"]] != [permit.fence] or listing["waiting"] != 0 \
                or permit.permit_id in repr(listing) or listing["holders"][0]["expires_in_ms"] <= 0:
            fail(f"holders {listing!r}, want fence {permit.fence} alone, nobody waiting, no id")
        if not sem.is_held(permit.fence) or sem.is_held(permit.fence + 1):
            fail(f"is_held wrong for fence {permit.fence} (held) or {permit.fence + 1} (never granted)")
        expect(sluice.NoPermit, lambda: sem.acquire(weight=int(limit), wait=0.2))
        expect(sluice.BadRequest, lambda: sem.acquire(weight=int(limit) + 1))
        wrong = sluice.Semaphore(base_url, name, int(limit), token="wrong-token")
        expect(sluice.Unauthorized, lambda: wrong.acquire())
        before = permit.valid_until
        sem.renew(permit)
        if permit.valid_until < before:
            fail("renewal moved valid_until back")
        sem.release(permit)
        if permit.valid():
            fail("a released permit is still valid")
        if sem.is_held(permit.fence):
            fail("a released permit is still held")
        expect(sluice.PermitLost, lambda: sem.renew(permit))
        expect(sluice.PermitLost, lambda: sem.release(permit))
        # A renewal that finds the permit lost marks it invalid at once.
        permit = sem.acquire()
        copy = sluice.Permit(name, permit.permit_id, permit.fence, permit.valid_until)
        sem.release(permit)
        expect(sluice.PermitLost, lambda: sem.renew(copy))
        if copy.valid():
            fail("a permit found lost by renew is still valid")

        # hold renews in the background: the permit outlives 3 TTLs, and
        # the server still counts it (another acquire finds no room).
        short = sluice.Semaphore(base_url, name + "-renew", 1, ttl=0.3, token=token)
        held = short.hold()
        with held as permit:
            first = permit.valid_until
            time.sleep(0.9)  # the span under test, not a synchronisation
            if not permit.valid() or permit.valid_until <= first + 0.5 or held.error is not None:
                fail(f"not renewed: {permit!r}, error {held.error!r}")
            expect(sluice.NoPermit, lambda: short.acquire())
        if permit.valid():
            fail("still valid after the with block released it")
        short.release(short.acquire())  # released on exit: room again
        say("errors ok")
    elif mode == "crowd":
        crowd(sem, int(args[0]))
    else:
        fail(f"unknown mode {mode}")


def crowd(sem, waiters):
    """Hold the semaphore (of limit 1), have waiters threads wait on it,
    one more acquire refused with TooManyWaiters (serve's
    --coord-max-waiters is waiters), print "crowded", and then, when the
    test stops serve, every waiter answered with Unavailable."""
    sem.acquire()
    answers = []

    def wait():
        while True:
            try:
                sem.acquire(wait=8)
                answers.append("granted")
                return
            except sluice.TooManyWaiters:
                continue  # while the probe below holds a place: again
            except sluice.SluiceError as e:
                answers.append(e)
                return

    threads = [threading.Thread(target=wait) for _ in range(waiters)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 8
    while True:
        try:
            sem.acquire(wait=0.001)
            fail("granted beside the holder")
        except sluice.NoPermit:
            if time.monotonic() > deadline:
                fail("no TooManyWaiters")
        except sluice.TooManyWaiters as e:
            if not e.detail or e.status != 429:
                fail(f"odd {e!r}")
            break
    say("crowded")
    for t in threads:
        t.join()
    if len(answers) != waiters or not all(isinstance(a, sluice.Unavailable) and a.detail for a in answers):
        fail(f"waiters at shutdown: {answers!r}, want Unavailable each")
    say("unavailable ok")


if __name__ == "__main__":
    main(*sys.argv[1:])
