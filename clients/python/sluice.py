"""A client of Sluice's distributed semaphores, paced rate limits and
capacity leases, standard library only.

It speaks the JSON/HTTP API that ``sluice serve`` answers
(POST /v1/semaphores/acquire, /renew and /release; POST /v1/reserve;
POST /v1/leases/join, /demand, /watch and /leave; docs/openapi.yaml in
the repository) and nothing else. Copy this one file into a program, or put its directory on
PYTHONPATH.

    sem = Semaphore("http://127.0.0.1:8080", "reports-db", limit=3, ttl=30)
    with sem.hold(wait=5) as permit:      # renewed in the background
        headers = permit.set_fence({})    # Sluice-Fencing-Token and -Resource
        ...                               # check permit.valid() before each step

Paced waiting under serve's rate limits (POST /v1/reserve): reserve a
cost and wait the answer's wait before sending, so that processes sharing
a limit never retry into 429s.

    limits = RateLimits("http://127.0.0.1:8080")
    limits.pace("api", [{"tenant": "acme"}], cost=1, max_wait=5)  # sleeps
    ...                                   # now send

    # Share a downstream's 500 requests a second with the other holders.
    holder = LeaseHolder("http://127.0.0.1:8080", "billing-api", capacity=500, partitions=20)
    with holder.run(demand=lambda: (0, len(queue))):  # heartbeats and watch in the background
        while queue:
            holder.pacer.acquire()        # paced at the granted rate; catches up after a stall
            send(queue.pop())

Durations are in seconds (floats); the API's milliseconds are converted.
A permit's validity is kept on time.monotonic(), from when the request
that granted or renewed it was sent, so that a change of the wall clock
does not extend it.

Every HTTP call has a timeout. An answer of an error status raises an
instance of a subclass of SluiceError carrying the status and the
problem's detail; a request that got no answer raises the OSError of
urllib (URLError, TimeoutError).
"""

import collections
import json
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

__all__ = [
    "Semaphore",
    "Permit",
    "Held",
    "SluiceError",
    "BadRequest",
    "Unauthorized",
    "PermitLost",
    "NoPermit",
    "TooManyWaiters",
    "Unavailable",
    "HolderLost",
    "TooManyHolders",
    "LeaseHolder",
    "LeaseGrant",
    "Pacer",
    "FENCING_TOKEN_HEADER",
    "FENCING_RESOURCE_HEADER",
    "RateLimits",
    "OverLimit",
    "UnknownReservation",
]

FENCING_TOKEN_HEADER = "Sluice-Fencing-Token"
FENCING_RESOURCE_HEADER = "Sluice-Fencing-Resource"

# The bytes the fencing resource keeps unescaped besides letters and
# digits (Go's url.PathEscape, which package fence's Set uses).
_RESOURCE_SAFE = "-._~$&+:=@"


class SluiceError(Exception):
    """An error answer of sluice serve.

    status is the HTTP status, title and detail those of the RFC 9457
    problem (detail says what is wrong; empty when the body was none).
    """

    def __init__(self, status, title="", detail=""):
        self.status = status
        self.title = title
        self.detail = detail
        super().__init__(f"sluice: {status} {title}: {detail}" if detail else f"sluice: {status} {title}")


class BadRequest(SluiceError):
    """400: the request is malformed or outside the server's bounds."""


class Unauthorized(SluiceError):
    """401: the bearer token is missing or wrong."""


class PermitLost(SluiceError):
    """404: the permit id holds no permit of this name any more (it
    lapsed, was released, or never existed)."""


class NoPermit(SluiceError):
    """409: no permit was granted within the wait; every permit is held."""


class TooManyWaiters(SluiceError):
    """429: too many acquires already wait on this semaphore."""


class Unavailable(SluiceError):
    """503: the store could not be reached (for an acquire that waits:
    it still failed when the wait ended; serve waits through shorter
    failures), or serve is shutting down."""


class HolderLost(PermitLost):
    """404 from a lease call: the holder id names no holder of the service
    on this server (it left, went silent for longer than its TTL, or
    joined another server). Join again."""


class TooManyHolders(TooManyWaiters):
    """429 from a lease join: the service has as many holders as the
    server allows, or the server keeps as many services as it allows."""


_ERRORS = {
    400: BadRequest,
    401: Unauthorized,
    404: PermitLost,
    409: NoPermit,
    429: TooManyWaiters,
    503: Unavailable,
}

_LEASE_ERRORS = {**_ERRORS, 404: HolderLost, 429: TooManyHolders}


class Permit:
    """A granted permit of a semaphore.

    permit_id is the capability that renews or releases it (keep it
    secret); fence its fencing token, larger than every earlier grant's
    of the name; valid_until the time.monotonic() instant until which
    the server holds it for us, renewals moving it on.
    """

    def __init__(self, name, permit_id, fence, valid_until):
        self.name = name
        self.permit_id = permit_id
        self.fence = fence
        self.valid_until = valid_until

    def valid(self):
        """Whether the permit is still held, by the monotonic clock now."""
        return time.monotonic() < self.valid_until

    def set_fence(self, headers):
        """Set the fencing header fields of this permit in headers (a dict
        of an outgoing request's header fields, or anything with item
        assignment, such as urllib.request.Request.headers), replacing
        any values they had, and return headers.

        The resource is the semaphore's name, percent-encoded as package
        fence reads it; the token is the fence in decimal. A fence.Guard
        refuses a token below the highest it has seen for the resource,
        so it admits only the newest grant's holder: it suits a semaphore
        of limit 1 (a lock), or a service that keys what it checks per
        grant.
        """
        headers[FENCING_TOKEN_HEADER] = str(self.fence)
        headers[FENCING_RESOURCE_HEADER] = urllib.parse.quote(self.name, safe=_RESOURCE_SAFE)
        return headers

    def __repr__(self):
        # The id is a secret: not shown.
        return f"Permit(name={self.name!r}, fence={self.fence}, valid={self.valid()})"


class Semaphore:
    """A distributed semaphore held by sluice serve at base_url.

    name is the semaphore's name, limit the most weight held at once
    under it (every caller of a name should agree), ttl the seconds a
    permit lives unless renewed (a crashed holder's permit comes back
    within it), token the bearer token serve requires, if any. timeout
    bounds every HTTP call, beyond the wait of an acquire.
    """

    def __init__(self, base_url, name, limit, ttl=10.0, token=None, timeout=5.0):
        if ttl <= 0 or timeout <= 0:
            raise ValueError("ttl and timeout must be positive")
        self.base_url = base_url.rstrip("/")
        self.name = name
        self.limit = limit
        self.ttl = ttl
        self.token = token
        self.timeout = timeout

    def acquire(self, weight=1, wait=0.0, fair=False):
        """Acquire a permit of weight, waiting up to wait seconds for room
        (0: one attempt), and return it as a Permit.

        Raises NoPermit when none came within the wait, TooManyWaiters,
        and the other SluiceErrors.
        """
        sent = time.monotonic()
        body = {"name": self.name, "limit": self.limit, "weight": weight,
                "ttl_ms": _millis(self.ttl), "wait_ms": _millis(wait)}
        if fair:
            body["fair"] = True
        answer = self._post("/v1/semaphores/acquire", body, self.timeout + wait)
        return Permit(self.name, answer["permit_id"], answer["fence"], sent + answer["valid_for_ms"] / 1000)

    def renew(self, permit, ttl=None):
        """Extend permit by ttl seconds (the semaphore's ttl when None) from
        now, moving its valid_until on, and return it.

        Raises PermitLost when the permit lapsed or was released, and
        then marks it invalid at once.
        """
        sent = time.monotonic()
        body = {"name": self.name, "permit_id": permit.permit_id,
                "ttl_ms": _millis(self.ttl if ttl is None else ttl)}
        # A renewal answered after the permit ran out is no use; wait no
        # longer than the permit lives, nor than timeout.
        timeout = min(self.timeout, max(permit.valid_until - sent, 0.1))
        try:
            answer = self._post("/v1/semaphores/renew", body, timeout)
        except PermitLost:
            permit.valid_until = float("-inf")
            raise
        permit.valid_until = max(permit.valid_until, sent + answer["valid_for_ms"] / 1000)
        return permit

    def release(self, permit):
        """Give permit back. Raises PermitLost when it was not held."""
        self._post("/v1/semaphores/release", {"name": self.name, "permit_id": permit.permit_id}, self.timeout)
        permit.valid_until = float("-inf")

    def holders(self):
        """The permits of the semaphore held now, by fence, never their
        ids, as serve answers POST /v1/semaphores/holders: a dict with
        "name", "holders" (each a dict of "fence", "weight",
        "held_for_ms", absent when serve does not know it, and
        "expires_in_ms") and "waiting" (the acquires waiting on the name
        in the serve that answered).
        """
        return self._post("/v1/semaphores/holders", {"name": self.name}, self.timeout)

    def is_held(self, fence):
        """Whether the permit of fence is held now: the check a protected
        service makes of a fencing token it received (a holder whose
        permit expired while it was paused is not held, whether or not
        anyone was granted after it). One round trip; true of the instant
        serve read its store.
        """
        return any(h["fence"] == fence for h in self.holders()["holders"])

    def hold(self, weight=1, wait=0.0, fair=False, renew_every=1 / 3):
        """A context manager that acquires a permit on entry (as acquire),
        renews it in a background thread every renew_every of the TTL,
        and releases it on exit; it gives the Permit to the with block.

        If a renewal finds the permit lost (permit.valid() turns false at
        once), or fails until the permit has run out, the thread stops
        (the Held's error says why): check permit.valid()
        before each step that the permit protects, and send its fence.
        A permit found lost on exit is not an error; any other failure of
        the release is raised (the permit then lapses within its TTL).
        """
        return Held(self, weight, wait, fair, renew_every)

    def _post(self, path, body, timeout):
        return _post(self.base_url, self.token, path, body, timeout)


class Held:
    """The context manager of Semaphore.hold (see there)."""

    def __init__(self, sem, weight, wait, fair, renew_every):
        if not 0 < renew_every < 1:
            raise ValueError("renew_every must be a fraction of the TTL, between 0 and 1")
        self._sem = sem
        self._args = (weight, wait, fair)
        self._interval = sem.ttl * renew_every
        self._stop = threading.Event()
        self._thread = None
        self.permit = None
        self.error = None  # the exception that stopped the renewals, if any

    def __enter__(self):
        self.permit = self._sem.acquire(*self._args)
        self._thread = threading.Thread(target=self._renew, name=f"sluice-renew-{self._sem.name}", daemon=True)
        self._thread.start()
        return self.permit

    def _renew(self):
        while not self._stop.wait(self._interval):
            try:
                self._sem.renew(self.permit)
            except PermitLost as e:
                self.error = e
                return
            except (SluiceError, OSError) as e:
                # Transient (503, a timeout): try again at the next turn
                # while the permit may still be held.
                if not self.permit.valid():
                    self.error = e
                    return

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        try:
            self._sem.release(self.permit)
        except PermitLost:
            pass  # lapsed already: nothing to give back
        return False


def _millis(seconds):
    return max(int(round(seconds * 1000)), 0)


def _error(status, body, errors=None):
    title, detail = "", ""
    try:
        problem = json.loads(body)
        title, detail = str(problem.get("title", "")), str(problem.get("detail", ""))
    except (ValueError, AttributeError):
        detail = body[:200].decode("utf-8", "replace")
    return (errors or _ERRORS).get(status, SluiceError)(status, title, detail)


# Paced waiting (POST /v1/reserve).


class OverLimit(SluiceError):
    """429 from /v1/reserve: the reservation would have to wait longer
    than max_wait (nothing was taken). retry_after is the seconds after
    which the same reservation would be admitted (math.inf: never, a cost
    above a limit's capacity); answer the decoded body."""

    def __init__(self, retry_after, answer):
        self.retry_after = retry_after
        self.answer = answer
        super().__init__(429, "over limit", f"retry after {retry_after:.3f}s")


class UnknownReservation(SluiceError):
    """404 from /v1/settle: the reservation was never kept, or has
    expired (it stays charged at its estimate)."""


_SETTLE_ERRORS = {**_ERRORS, 404: UnknownReservation}


class RateLimits:
    """The rate limits of sluice serve at base_url, checked now or
    reserved ahead.

    check asks "may this go now?" (POST /v1/check); with settle=True an
    admitted check keeps its cost as an estimate, which settle corrects
    with the actual cost once the work is done (POST /v1/settle): a cost
    known only after the answer, such as an LLM call's output tokens.

    A reservation asks "how long must I wait to send this?": serve takes
    the cost now, under every limit the descriptors match (gcra or
    leaky_bucket limits), and answers the wait; a process that sends
    when it has waited it stays within the limits, whatever other
    processes share them. timeout bounds every HTTP call.
    """

    def __init__(self, base_url, timeout=5.0):
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def check(self, domain, descriptors, cost=1, costs=None, settle=False, settle_within=None):
        """Decide cost (and costs, {cost unit: cost} for limits that count
        a unit) under domain's limits for descriptors now, and return the
        decoded answer: answer["allowed"], and, when settle is true and the
        check was admitted, answer["reservation"], the id to settle within
        settle_within seconds (the server's default, 5 minutes, when None).
        Over a limit is an answer (allowed false), not an error;
        BadRequest and the other SluiceErrors are raised."""
        body = self._body(domain, descriptors, cost, costs, settle, settle_within)
        return _post(self.base_url, None, "/v1/check", body, self.timeout, answers=(429,))

    def settle(self, reservation, cost=None, costs=None):
        """Settle reservation with its actual cost (cost: every
        descriptor's; costs: {cost unit: actual cost}; a limit whose unit
        costs does not name, or without a unit when cost is None, is
        settled at its estimate). Returns the decoded answer: settled (or
        already_settled, for a repeat, which is harmless), and the units
        refunded and charged. Raises UnknownReservation when it was never
        kept or has expired, and the other SluiceErrors."""
        body = {"reservation": reservation}
        if cost is not None:
            body["cost"] = cost
        if costs:
            body["costs"] = dict(costs)
        return _post(self.base_url, None, "/v1/settle", body, self.timeout, _SETTLE_ERRORS)

    @staticmethod
    def _body(domain, descriptors, cost, costs, settle, settle_within):
        body = {"domain": domain, "descriptors": [_descriptor(d) for d in descriptors], "cost": cost}
        if costs:
            body["costs"] = dict(costs)
        if settle:
            body["settle"] = True
            if settle_within is not None:
                body["settle_within_ms"] = _millis(settle_within)
        return body

    def reserve(self, domain, descriptors, cost=1, max_wait=1.0, costs=None):
        """Reserve cost under domain's limits for descriptors, accepting a
        wait of up to max_wait seconds, and return the seconds to wait
        (from when this returns) before sending.

        descriptors is a list of descriptors, each a dict of entries
        ({"tenant": "acme", "user": "ann"}, outer level first) or a list
        of (key, value) pairs; costs, {cost unit: cost}, the costs of limits
        that count a unit (input_tokens, …). Raises OverLimit when the wait would be
        longer than max_wait (nothing is taken), BadRequest for a limit
        that cannot be reserved or a max_wait beyond the server's bound,
        and the other SluiceErrors.
        """
        body = self._body(domain, descriptors, cost, costs, False, None)
        body["max_wait_ms"] = _millis(max_wait)
        req = urllib.request.Request(self.base_url + "/v1/reserve", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Accept": "application/json"},
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                data = e.read()
                if e.code != 429:
                    raise _error(e.code, data) from None
                answer = json.loads(data)
            finally:
                e.close()
            retry = 0.0
            for d in answer["descriptors"]:
                if not d["allowed"] and "retry_after_ms" in d:
                    ms = d["retry_after_ms"]
                    retry = math.inf if ms < 0 else max(retry, ms / 1000)
            raise OverLimit(retry, answer) from None
        return answer["wait_ms"] / 1000

    def pace(self, domain, descriptors, cost=1, max_wait=1.0, sleep=time.sleep, costs=None):
        """Reserve as reserve does, then sleep the wait; return when the
        caller may send, with the seconds slept. Refused because the queue
        is longer than max_wait, it sleeps the answer's retry_after and
        reserves again; a cost that can never pass raises OverLimit."""
        slept = 0.0
        while True:
            try:
                wait = self.reserve(domain, descriptors, cost, max_wait, costs)
            except OverLimit as e:
                if math.isinf(e.retry_after):
                    raise
                wait = None
                retry = max(e.retry_after, 0.001)
            if wait is not None:
                if wait > 0:
                    sleep(wait)
                return slept + wait
            sleep(retry)
            slept += retry


def _descriptor(d):
    items = d.items() if isinstance(d, dict) else d
    return {"entries": [{"key": str(k), "value": str(v)} for k, v in items]}


def _post(base_url, token, path, body, timeout, errors=None, answers=()):
    """POST body as JSON and return the decoded answer; an error status
    raises its SluiceError, except those in answers, whose body is the
    answer."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token is not None:
        headers["Authorization"] = "Bearer " + token
    req = urllib.request.Request(base_url + path, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = resp.read()
    except urllib.error.HTTPError as e:
        try:
            data = e.read()
            if e.code not in answers:
                raise _error(e.code, data, errors) from None
        finally:
            e.close()
    return json.loads(data) if data else None


class LeaseGrant:
    """What a lease holder may use, as one answer of serve gave it.

    rate is the capacity of its valid leases (units a second); pace_rate
    and burst the token bucket to pace with, so that no window of window
    seconds receives more than its share (Pacer paces at pace_rate and
    guards each window at pace_rate / rate of the capacity held over it);
    valid_until the time.monotonic() instant until which it may use them
    (counted from when the request was sent, or a watch's answer
    received); version grows with every change; leases the (partition,
    epoch) pairs held.
    """

    def __init__(self, answer, since):
        self.holder_id = answer["holder_id"]
        self.version = answer["version"]
        self.rate = answer["rate"]
        self.pace_rate = answer["pace_rate"]
        self.burst = answer["burst"]
        self.window = answer["window_ms"] / 1000
        self.valid_until = since + answer["valid_for_ms"] / 1000
        self.leases = [(x["partition"], x["epoch"]) for x in answer["leases"]]

    def valid(self):
        """Whether the grant may still be used, by the monotonic clock now."""
        return time.monotonic() < self.valid_until

    def __repr__(self):
        # The holder id is a secret: not shown.
        return (f"LeaseGrant(version={self.version}, rate={self.rate}, pace_rate={self.pace_rate}, "
                f"burst={self.burst}, leases={len(self.leases)}, valid={self.valid()})")


# How much faster than its pace a Pacer catches up after a stall.
_CATCHUP_SPEED = 2.0


class Pacer:
    """Paces a lease holder's sends at its granted rate, so that no window
    of the downstream receives more than the holder's share of it, and
    lets a sender that stalled catch up (lease.Limiter's model, in Go).

    The schedule: units are earned at the grant's pace_rate while the
    grant is valid, and acquire takes them. A sender that stalls (a
    starved thread, a late wake-up) keeps what it earned, up to catchup
    seconds' worth (a quarter of the window when None), and catches up
    when it runs again, at up to twice the pace (a burst of units sent at
    once reaches the downstream spread out, some in its next window): a
    stall costs no time, as long as the guard allows. Nothing is earned
    past the grant's valid_until, nor given: capacity that grows starts
    empty, and a pace that shrinks cuts what was earned to the new pace's
    catchup.

    The guard: the units acquired in any window of the grant's window_ms
    (W) ending now, counted at the instants acquire let them through,
    never exceed ceil(share × credit) (at least the burst), where credit
    is the capacity the holder held over that window, its granted rate
    integrated over it (no rate while no grant was valid), and share =
    pace_rate / rate, the schedule's own part of the rate (98 % with
    serve's pacing): catching up refills what a stall left out of the
    window, and no window gets fuller than the schedule fills one when
    nothing stalls, so the 1 to 2 % left of the capacity stays for the
    jitter between the instants acquire returns and those at which the
    downstream counts the sends. The holders' rates never add up to more
    than the capacity at any instant: serve hands a partition a holder
    yields to another only once the yielder has acknowledged the grant
    without it, and the holder acknowledges a grant only once its pacer
    paces by it. So their credits over any window add up to at most
    capacity × W, and catching up never puts more than the capacity into
    a window of those instants, wherever it starts (a downstream's fixed
    windows included, as far as it counts the sends when they are made:
    one that counts them late, stalled, may still find too many in a
    window). Across a change of rate the credit counts the old rate and
    the new pro rata: a holder whose share shrank goes on at its new rate
    at once, and one whose share grew has the larger capacity as the
    window moves past the change.

    Nothing is let through at or after the grant's valid_until: a holder
    cut off from serve stops when the last validity it was told ends,
    on the monotonic clock.
    """

    def __init__(self, catchup=None):
        if catchup is not None and catchup < 0:
            raise ValueError("catchup must not be negative")
        self._catchup = catchup
        self._cond = threading.Condition()
        self._turn = threading.Lock()  # held by the one caller waiting for its turn
        self._pace = 0.0  # the schedule's rate, units a second
        self._cap = 0.0  # the most units earned and kept
        self._burst = 0
        self._tokens = 0.0  # earned, not taken
        self._quick = 0.0  # the catch-up's own bucket: twice the pace, a small burst
        self._qcap = 0.0
        self._last = time.monotonic()  # earned up to here
        self._until = float("-inf")
        self._window = 1.0
        self._share = 1.0
        self._rates = collections.deque()  # [start, end, rate]: the granted rate over the last window
        self._sent = collections.deque()  # (instant, units) acquired in the last window
        self._count = 0  # the units in _sent
        self._closed = False

    def update(self, grant):
        """Pace by grant from now on."""
        with self._cond:
            now = time.monotonic()
            self._advance(now)
            rate, pace, burst = max(grant.rate, 0.0), max(grant.pace_rate, 0.0), max(grant.burst, 0)
            self._window = grant.window if grant.window > 0 else 1.0
            self._pace, self._burst = pace, burst
            catchup = self._window / 4 if self._catchup is None else self._catchup
            self._cap = max(float(burst), pace * catchup)
            self._tokens = min(self._tokens, self._cap)
            self._qcap = max(float(burst), _CATCHUP_SPEED * pace * self._window / 100)
            self._quick = min(self._quick, self._qcap)
            self._share = min(1.0, pace / rate) if rate > 0 else 1.0
            self._until = grant.valid_until
            # The rate history: the current rate ends now (or at its
            # validity, if that came first), the grant's starts.
            if self._rates:
                last = self._rates[-1]
                last[1] = min(last[1], now)
                if last[2] == rate and last[1] >= now:
                    last[1] = max(now, grant.valid_until)
                else:
                    self._rates.append([now, max(now, grant.valid_until), rate])
            else:
                self._rates.append([now, max(now, grant.valid_until), rate])
            while len(self._rates) > 1 and self._rates[0][1] <= now - self._window:
                self._rates.popleft()
            self._cond.notify_all()

    def close(self):
        """Wake every caller of acquire: they return False."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _advance(self, now):
        earn_to = min(now, self._until)
        if earn_to > self._last:
            self._tokens = min(self._cap, self._tokens + self._pace * (earn_to - self._last))
            self._quick = min(self._qcap, self._quick + _CATCHUP_SPEED * self._pace * (earn_to - self._last))
        self._last = max(self._last, now)

    def _credit(self, now):
        """The capacity held over the window ending at now, in units."""
        lo = now - self._window
        return sum(r * max(0.0, min(e, now) - max(s, lo)) for s, e, r in self._rates)

    def _guard(self, now, n):
        """How long after now n more units fit in the window's share: 0
        when they fit now."""
        lo = now - self._window
        while self._sent and self._sent[0][0] <= lo:
            self._count -= self._sent.popleft()[1]
        limit = max(self._burst, math.ceil(self._share * self._credit(now) - 1e-9))
        if self._count + n <= limit:
            return 0.0
        # Look again when the oldest unit leaves the window, or sooner:
        # the credit grows as the window moves on.
        wait = self._window / 20
        if self._sent:
            wait = min(wait, self._sent[0][0] + self._window - now)
        return max(wait, 0.0005)

    def acquire(self, n=1, timeout=None):
        """Take n units, waiting for them (at most timeout seconds when it
        is not None); return whether they were taken (False after the
        timeout, or once closed). Callers take turns: one at a time waits
        for the units, the others for their turn. n must be at most the
        grant's burst (or a hundredth of a window at twice the pace, if
        more), its share of a window and what catchup keeps; a larger n
        waits for a grant that allows it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._turn.acquire(timeout=-1 if deadline is None else max(deadline - time.monotonic(), 0)):
            return False
        try:
            with self._cond:
                while not self._closed:
                    now = time.monotonic()
                    self._advance(now)
                    fits = False
                    if self._rates:
                        most = max(self._burst, math.ceil(self._share * self._rates[-1][2] * self._window - 1e-9))
                        fits = n <= self._cap and n <= self._qcap and n <= most
                    if now < self._until and self._pace > 0 and fits:
                        if self._tokens >= n and self._quick >= n:
                            wait = self._guard(now, n)
                            if wait == 0:
                                self._tokens -= n
                                self._quick -= n
                                self._sent.append((now, n))
                                self._count += n
                                return True
                        else:
                            wait = max(n - self._tokens, (n - self._quick) / _CATCHUP_SPEED) / self._pace
                        wait = min(wait, self._until - now)
                    else:
                        wait = 1.0  # no valid grant that could serve n: update wakes us
                    if deadline is not None:
                        if now >= deadline:
                            return False
                        wait = min(wait, deadline - now)
                    self._cond.wait(max(wait, 0.0005))
                return False
        finally:
            self._turn.release()


class LeaseHolder:
    """A holder of capacity leases on a downstream service, held by
    sluice serve at base_url.

    service names the downstream; capacity (units a second) and partitions
    must be the same for every holder of it. ttl is the holder's TTL in
    seconds (None: serve's default): it must state its demand at least
    this often, and a holder silent for longer is ended and its leases
    expire. window is the downstream's counting window in seconds (None:
    one). timeout bounds every HTTP call, beyond a watch's wait.

    join, demand, watch and leave are the API's calls; run does them in
    background threads and keeps pacer (a Pacer) up to date: a grant is
    paced by before it is acknowledged (the version demand and watch
    send), so the capacity it takes away goes to the others only once
    this holder has stopped using it.
    """

    def __init__(self, base_url, service, capacity, partitions, ttl=None, weight=None, window=None,
                 token=None, timeout=5.0):
        if timeout <= 0 or (ttl is not None and ttl <= 0):
            raise ValueError("ttl and timeout must be positive")
        self.base_url = base_url.rstrip("/")
        self.service = service
        self.capacity = capacity
        self.partitions = partitions
        self.ttl = ttl
        self.weight = weight
        self.window = window
        self.token = token
        self.timeout = timeout
        self.pacer = Pacer()
        self._lock = threading.Lock()
        self.grant = None  # the newest LeaseGrant
        self._applied = 0  # the newest version the pacer paces by

    @property
    def holder_id(self):
        return self.grant.holder_id if self.grant else None

    def _take(self, answer, since):
        """Make answer the grant if it is as new as the one held, pace by
        it, and return the grant held."""
        g = LeaseGrant(answer, since)
        with self._lock:
            cur = self.grant
            if cur is None or g.version > cur.version or (g.version == cur.version and g.valid_until > cur.valid_until):
                self.grant = g
                self.pacer.update(g)
                self._applied = max(self._applied, g.version)
            return self.grant

    def join(self, rate=0.0, backlog=0):
        """Join the service, stating a first demand; return the first
        LeaseGrant (no leases yet: they come through watch).

        Raises TooManyHolders, BadRequest and the other SluiceErrors."""
        body = {"service": self.service, "capacity": self.capacity, "partitions": self.partitions,
                "rate": rate, "backlog": int(backlog)}
        if self.ttl is not None:
            body["ttl_ms"] = _millis(self.ttl)
        if self.weight is not None:
            body["weight"] = self.weight
        if self.window is not None:
            body["window_ms"] = _millis(self.window)
        sent = time.monotonic()
        answer = _post(self.base_url, self.token, "/v1/leases/join", body, self.timeout, _LEASE_ERRORS)
        with self._lock:
            self.grant, self._applied = None, 0
        return self._take(answer, sent)

    def demand(self, rate=0.0, backlog=0):
        """State the demand: rate units a second arriving, backlog units
        held back for want of rate (with a backlog, the holder asks for
        its whole fair share). It is the holder's heartbeat, and tells
        serve the newest grant the pacer paces by, so that what that grant
        took away goes to the others. Return the newest LeaseGrant.

        Raises HolderLost when serve no longer holds the holder."""
        with self._lock:
            body = {"service": self.service, "holder_id": self.holder_id, "rate": rate,
                    "backlog": int(backlog), "version": self._applied}
        sent = time.monotonic()
        answer = _post(self.base_url, self.token, "/v1/leases/demand", body, self.timeout, _LEASE_ERRORS)
        return self._take(answer, sent)

    def watch(self, wait=5.0):
        """Wait up to wait seconds for the grant to change (a long poll),
        and return the newest LeaseGrant."""
        with self._lock:
            body = {"service": self.service, "holder_id": self.holder_id, "version": self._applied,
                    "wait_ms": _millis(wait)}
        answer = _post(self.base_url, self.token, "/v1/leases/watch", body, self.timeout + wait, _LEASE_ERRORS)
        # A watch's answer may have waited: its validity counts from now.
        return self._take(answer, time.monotonic())

    def leave(self):
        """Leave the service: its leases go to the others at once. Stop
        sending first. Raises HolderLost when it had ended already."""
        try:
            _post(self.base_url, self.token, "/v1/leases/leave",
                  {"service": self.service, "holder_id": self.holder_id}, self.timeout, _LEASE_ERRORS)
        finally:
            self.pacer.close()

    def run(self, demand=lambda: (0.0, 0), beat=None, wait=5.0):
        """A context manager that joins (unless joined already), states
        demand() (a (rate, backlog) pair) every beat seconds (a quarter of
        the TTL, or of serve's default of 3 s, when None; each due a beat
        after the previous one was sent, not after its answer) and watches
        the grant in background threads, and leaves on exit.

        The threads stop when serve no longer holds the holder
        (HolderLost; the Running's error says so), and the pacer then
        lets nothing through once the last grant's validity has ended.
        """
        return Running(self, demand, beat, wait)


class Running:
    """The context manager of LeaseHolder.run (see there)."""

    def __init__(self, holder, demand, beat, wait):
        self._h = holder
        self._demand = demand
        self._beat = beat if beat is not None else (holder.ttl or 3.0) / 4
        self._wait = wait
        self._stop = threading.Event()
        self._left = False
        self._threads = []
        self.error = None  # the exception that stopped the threads, if any

    def __enter__(self):
        if self._h.grant is None:
            rate, backlog = self._demand()
            self._h.join(rate, backlog)
        for target, name in ((self._beats, "beat"), (self._watches, "watch")):
            t = threading.Thread(target=target, name=f"sluice-lease-{name}-{self._h.service}", daemon=True)
            t.start()
            self._threads.append(t)
        return self._h

    def _beats(self):
        # Each beat is due a period after the previous one was sent, not
        # after its answer came: a slow answer, or a thread that ran late,
        # does not push the next renewal of the validity back.
        while not self._stop.is_set():
            due = time.monotonic() + self._beat
            try:
                rate, backlog = self._demand()
                self._h.demand(rate, backlog)
            except HolderLost as e:
                self._fail(e)
                return
            except (SluiceError, OSError):
                pass  # transient: the next beat, while the grant lasts
            self._stop.wait(max(due - time.monotonic(), 0))

    def _watches(self):
        while not self._stop.is_set():
            try:
                self._h.watch(self._wait)
            except HolderLost as e:
                self._fail(e)
                return
            except (SluiceError, OSError):
                self._stop.wait(0.05)  # transient: try again soon

    def _fail(self, e):
        if not self._left:
            self.error = e
        self._stop.set()

    def __exit__(self, *exc):
        self._stop.set()
        beats, watches = self._threads
        beats.join()
        if self.error is None:
            # Leaving ends the watch's long poll too (HolderLost).
            self._left = True
            try:
                self._h.leave()
            except HolderLost:
                pass  # ended already: nothing to give back
        self._h.pacer.close()
        watches.join()
        return False
