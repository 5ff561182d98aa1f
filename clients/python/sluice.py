"""A client of Sluice's distributed semaphores and paced rate limits,
standard library only.

It speaks the JSON/HTTP API that ``sluice serve`` answers
(POST /v1/semaphores/acquire, /renew and /release; docs/openapi.yaml in
the repository) and nothing else. Copy this one file into a program, or
put its directory on PYTHONPATH.

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

Durations are in seconds (floats); the API's milliseconds are converted.
A permit's validity is kept on time.monotonic(), from when the request
that granted or renewed it was sent, so that a change of the wall clock
does not extend it.

Every HTTP call has a timeout. An answer of an error status raises an
instance of a subclass of SluiceError carrying the status and the
problem's detail; a request that got no answer raises the OSError of
urllib (URLError, TimeoutError).
"""

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
    "FENCING_TOKEN_HEADER",
    "FENCING_RESOURCE_HEADER",
    "RateLimits",
    "OverLimit",
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
    """503: the store could not be reached, or serve is shutting down."""


_ERRORS = {
    400: BadRequest,
    401: Unauthorized,
    404: PermitLost,
    409: NoPermit,
    429: TooManyWaiters,
    503: Unavailable,
}


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
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = "Bearer " + self.token
        req = urllib.request.Request(self.base_url + path, data=json.dumps(body).encode(),
                                     headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                data = resp.read()
        except urllib.error.HTTPError as e:
            try:
                raise _error(e.code, e.read()) from None
            finally:
                e.close()
        return json.loads(data) if data else None


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


def _error(status, body):
    title, detail = "", ""
    try:
        problem = json.loads(body)
        title, detail = str(problem.get("title", "")), str(problem.get("detail", ""))
    except (ValueError, AttributeError):
        detail = body[:200].decode("utf-8", "replace")
    return _ERRORS.get(status, SluiceError)(status, title, detail)


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


class RateLimits:
    """The rate limits of sluice serve at base_url, reserved ahead.

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

    def reserve(self, domain, descriptors, cost=1, max_wait=1.0):
        """Reserve cost under domain's limits for descriptors, accepting a
        wait of up to max_wait seconds, and return the seconds to wait
        (from when this returns) before sending.

        descriptors is a list of descriptors, each a dict of entries
        ({"tenant": "acme", "user": "ann"}, outer level first) or a list
        of (key, value) pairs. Raises OverLimit when the wait would be
        longer than max_wait (nothing is taken), BadRequest for a limit
        that cannot be reserved or a max_wait beyond the server's bound,
        and the other SluiceErrors.
        """
        body = {"domain": domain, "descriptors": [_descriptor(d) for d in descriptors],
                "cost": cost, "max_wait_ms": _millis(max_wait)}
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

    def pace(self, domain, descriptors, cost=1, max_wait=1.0, sleep=time.sleep):
        """Reserve as reserve does, then sleep the wait; return when the
        caller may send, with the seconds slept. Refused because the queue
        is longer than max_wait, it sleeps the answer's retry_after and
        reserves again; a cost that can never pass raises OverLimit."""
        slept = 0.0
        while True:
            try:
                wait = self.reserve(domain, descriptors, cost, max_wait)
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
