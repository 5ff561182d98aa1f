"""A Python worker of TestSemaphoreScenario, using clients/python/sluice.py.

    semscen_worker.py BASE_URL TOKEN NAME LIMIT TTL STUB THREADS FAIR ID

THREADS threads each loop until stdin closes: hold a permit of NAME
(waiting up to 5 s a time; fair order when FAIR is "1"), check it is
still valid, send one POST to STUB with its fence (the Sluice-Fencing-*
header fields) and X-Worker: ID, and release it. It prints one line per
event, which the test reads:

    A MICROSECONDS   a permit granted, after so long in acquire
    E REASON         something went wrong (the test fails on any)
    T REASON         an acquire or a release answered 503 (the store failed)
    done GRANTS      stdin closed and every thread has stopped; GRANTS
                     counts the calls made to STUB
"""

import sys
import threading
import time
import urllib.error
import urllib.request

import sluice

_out = threading.Lock()


def say(line):
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def send(stub, permit, worker):
    req = urllib.request.Request(stub, data=b"{}", method="POST")
    permit.set_fence(req.headers)
    req.headers["X-Worker"] = worker
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        e.close()
        return e.code


def main(base_url, token, name, limit, ttl, stub, threads, fair, worker):
    sem = sluice.Semaphore(base_url, name, int(limit), ttl=float(ttl), token=token, timeout=10)
    fair = fair == "1"
    stop = threading.Event()
    grants = [0]

    def loop():
        while not stop.is_set():
            start = time.monotonic()
            try:
                with sem.hold(wait=5, fair=fair) as permit:
                    say(f"A {int((time.monotonic() - start) * 1e6)}")
                    if not permit.valid():
                        say(f"E permit {permit!r} invalid before its call")
                        continue
                    status = send(stub, permit, worker)
                    with _out:
                        grants[0] += 1
                    if status != 200:
                        say(f"E the stub answered {status} to fence {permit.fence}")
            except sluice.NoPermit:
                continue  # none within the wait: ask again
            except sluice.Unavailable as e:
                # The store failed (a call past serve's --redis-timeout):
                # an acquire's wait ends, a release's permit lapses
                # within its TTL. Ask again a little later.
                say(f"T {e!r}")
                stop.wait(0.05)  # not a synchronisation: no hot loop on a failing server
            except (sluice.SluiceError, OSError) as e:
                say(f"E {e!r}")
                stop.wait(0.05)  # not a synchronisation: no hot loop on a failing server

    ts = [threading.Thread(target=loop) for _ in range(int(threads))]
    for t in ts:
        t.start()
    sys.stdin.read()  # the test closes stdin to stop the worker
    stop.set()
    for t in ts:
        t.join()
    say(f"done {grants[0]}")


if __name__ == "__main__":
    main(*sys.argv[1:])
