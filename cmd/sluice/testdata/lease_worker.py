"""A processor of TestPythonLeases: it holds capacity leases of a service
through sluice serve (clients/python/sluice.py's LeaseHolder) and sends its
records to a throttled stub at the granted rate, each until accepted.

    lease_worker.py BASE TOKEN SERVICE NAME RECORDS STUB CAPACITY PARTITIONS TTL

It prints READY, starts on a line from stdin, and prints
"DONE NAME THROTTLED" when every record was accepted, THROTTLED being the
429s it met.
"""

import collections
import http.client
import sys
import threading
import urllib.parse

import sluice

WORKERS = 16


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


if __name__ == "__main__":
    main()
