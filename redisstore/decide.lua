-- Sluice: decide every item of one request, all or nothing.
--
-- ARGV is a header of argHeader values, then itemFields fields per item
-- (the names are declared just below):
--   argNow    the instant in Unix nanoseconds, or "" to read the server's TIME
--   argSlack  milliseconds added to every TTL (clock slack; 0 with TIME)
--   argCount  the number of items (negative: a batch of requests, see the end)
--   argMask   the algorithms present, a bit mask (1 << algorithm)
--   argDeadline  the cutoff, Unix ns of the server's TIME, or "" for none:
--             past it the script writes nothing and returns replyExpired,
--             since the client has given up on the call (see clock.go)
-- and per item:
--   fieldKey       key index (into KEYS; a sliding_log item's log list is
--                  the next key)
--   fieldAlg       algorithm (0 gcra, 1 fixed_window, 2 sliding_log,
--                  3 sliding_window, 4 leaky_bucket)
--   fieldCost, fieldQuota, fieldCapacity, fieldInterval,
--   fieldCapT      capacity*interval, fieldPeriod,
--   fieldWinStart, fieldWinEnd  the calendar window (Unix ns; "" when not
--                  calendar).
--
-- Returns replyFields integers per item: replyAllowed (0/1), replyReason
-- (reasonOK, reasonLimited, reasonExceeds: beyond capacity, reasonRescaled:
-- limited on a GCRA state written at another interval, see gcra),
-- replyRemaining, replyReset and replyRetry (ns, saturated at maxDuration);
-- or the single integer replyFar, having written nothing, when a state is
-- too far from now for doubles (see far): the caller then decides in Go;
-- or the single integer replyExpired, having written nothing, past the
-- cutoff.
--
-- State of a key: a string "alg|T|N|P|S|G": Algorithm, T, N, Prev and Seen
-- of ratelimit.State (T and S in Unix ns) and a generation G that every
-- write increments, so that Go's exact path can compare and set. A sliding_log keeps its
-- entries "at:cost", oldest first, in a list beside it.
--
-- Lua numbers are doubles. Instants are kept as (seconds, nanoseconds) pairs
-- and every computation is done relative to now, so durations and
-- differences are exact integers while they stay below 2^53 ns (104 days);
-- products go through mulDiv, exact for divisors below 2^52 ns (52 days).

-- Layout of ARGV and of the reply. script.go declares the same names with
-- the same values (argNow … maxDuration) and TestScriptLayout runs this
-- block to check that they agree. Offsets count from 0, as in Go: Go's
-- args[x] is ARGV[1 + x], and field f of an item whose fields start at
-- ARGV[a] is ARGV[a + f]. When script.go loads the script it writes the
-- values in place of the names below (inlineLayout: upvalues cost every
-- call), so never declare a local, parameter or field of these names.
local argNow, argSlack, argCount, argMask, argDeadline, argHeader = 0, 1, 2, 3, 4, 5
local fieldKey, fieldAlg, fieldCost, fieldQuota, fieldCapacity = 0, 1, 2, 3, 4
local fieldInterval, fieldCapT, fieldPeriod, fieldWinStart, fieldWinEnd = 5, 6, 7, 8, 9
local itemFields = 10
-- A batched request: its number of items, then their fields; its reply:
-- its number of values, then the values.
local batchReqHeader = 1
local replyAllowed, replyReason, replyRemaining, replyReset, replyRetry = 0, 1, 2, 3, 4
local replyFields = 5
local replyFar, replyExpired = -1, -2
local reasonOK, reasonLimited, reasonExceeds, reasonRescaled = 0, 1, 2, 3
local maxDuration = 9223372036854774784 -- 2^63 - 1024, the largest double below 2^63
-- End of the layout.

-- The instant of the call as (seconds, nanoseconds), or nil when it is not
-- one the fast path takes (before 1970 + 1 s); fnow is it in decimal, made
-- when first needed.
local fns, fnn, fnow
local nowArg = ARGV[1 + argNow]
local cut = ARGV[1 + argDeadline]
local tnow
if nowArg == '' or cut ~= '' then tnow = redis.call('TIME') end
-- Past the cutoff the client has given up on this call (a server stopped
-- and resumed, a command late in a buffer): it must not take effect. The
-- cutoff has at least 10 digits (see setCutoff).
if cut ~= '' and (string.sub(cut, 1, -10) - tnow[1]) * 1000000000 + (string.sub(cut, -9) - tnow[2] * 1000) < 0 then
  return {replyExpired}
end
if nowArg == '' then
  fns, fnn = tonumber(tnow[1]), tonumber(tnow[2]) * 1000
else
  local str = nowArg
  local len = #str
  if len > 9 and string.sub(str, 1, 1) ~= '-' then
    fns, fnn = tonumber(string.sub(str, 1, len - 9)), tonumber(string.sub(str, len - 8))
  end
end

-- Fast paths: a request of one GCRA item (the default algorithm) or one
-- fixed-window item (the default of envoy-format rule files). Alone in
-- a call, or leading a batch, it is decided before anything else is
-- defined, since creating the closures below costs more than the decision.
-- It handles the usual case (no rule change, no clock behind the state,
-- cost within capacity) and returns nil for every other one, having
-- written nothing, to be decided by the general path further down.

-- Converting a decimal string costs more than the rest of a decision:
-- tonum converts each distinct string once per call (a batch repeats its
-- rules' fields), and by arithmetic coercion, which parses once where
-- tonumber parses twice. Its arguments are always decimal integers.
local nums = {}
local function tonum(str)
  local x = nums[str]
  if x == nil then
    x = str + 0
    nums[str] = x
  end
  return x
end
local slack = tonum(ARGV[1 + argSlack])

-- px returns a TTL of ms milliseconds as a decimal string, each distinct
-- one made once per call: Redis formats a number argument of redis.call
-- with snprintf, a quarter of what a SET with a TTL costs (keys decided
-- together often share their TTL).
local pxs = {}
local function px(ms)
  local p = pxs[ms]
  if not p then
    p = string.format('%d', ms)
    pxs[ms] = p
  end
  return p
end

-- since returns the nanoseconds from (fns, fnn) to a stored instant of at
-- least 10 digits, split into seconds and their last 9 digits.
local function since(str)
  return (string.sub(str, 1, -10) - fns) * 1000000000 + (string.sub(str, -9) - fnn)
end

-- fastGCRA decides the GCRA item whose fields start at ARGV[a], at (fns,
-- fnn), on v, the value stored at key (false: none), at the item's cost
-- or, when given, at cost. It returns the decision and the value key
-- holds afterwards.
local function fastGCRA(a, key, v, cost)
  if not cost then cost = tonum(ARGV[a + fieldCost]) end
  local ivs, capT = ARGV[a + fieldInterval], tonum(ARGV[a + fieldCapT])
  local iv = tonum(ivs)
  if cost > tonum(ARGV[a + fieldCapacity]) then return nil end
  local debt, g = 0, 0
  if v then
    -- Anything but a GCRA state with T and Seen after 1970 + 1 s fails. A
    -- pattern without backtracking and since's string.sub cost a fraction
    -- of a pattern that splits the digits itself.
    local t, n, s, gs = string.match(v, '^0|(%d+)|(%d+)|[^|]*|(%d+)|(%d+)$')
    if not gs or #t < 10 or #s < 10 then return nil end
    g = gs + 0
    local trel = since(t)
    if since(s) > 0 or trel >= 4503599627370496 then
      return nil -- a clock behind the state's, or a state far ahead
    elseif trel > 0 then
      debt = trel
      if n ~= ivs and n + 0 ~= iv then return nil end -- the rule changed: rescale
    end
  end
  local allowed, reason, remaining, retry = 1, reasonOK, 0, 0
  if cost >= 0 and debt + cost * iv > capT then
    allowed, reason, retry = 0, reasonLimited, math.max(debt + cost * iv - capT, 1)
  elseif cost >= 0 then
    debt = debt + cost * iv
  else
    debt = math.max(0, debt + cost * iv)
  end
  local left = capT - debt
  if left > 0 then remaining = math.floor(left / iv) end
  if allowed == 1 and cost ~= 0 then
    if debt <= 0 and slack == 0 then
      redis.call('DEL', key)
      v = false
    else
      local q = math.floor(debt / 1000000000)
      local r = debt - q * 1000000000
      local ts, tn = fns + q, fnn + r
      if tn >= 1000000000 then ts, tn = ts + 1, tn - 1000000000 end
      -- One string.format with %d: Lua's own number to string (%.14g) is
      -- several times slower per number.
      if not fnow then fnow = string.format('%d%09d', fns, fnn) end
      v = string.format('0|%d%09d|%s|0|%s|%d', ts, tn, ivs, fnow, (g + 1) % 1000000000)
      redis.call('SET', key, v, 'PX', px(math.ceil(debt / 1000000) + slack))
    end
  end
  return {allowed, reason, remaining, debt, retry}, v -- in reply order
end

-- windows caches, per period, the start of the fixed window that holds
-- (fns, fnn), formatted as stored, and the nanoseconds to its end.
local windows = {}

-- fastFixed decides the fixed-window item whose fields start at ARGV[a],
-- as fastGCRA does; it takes periods that divide a second or are whole
-- seconds (every unit of envoy's rule files), without a calendar window.
local function fastFixed(a, key, v)
  local cost, limit, p = tonum(ARGV[a + fieldCost]), tonum(ARGV[a + fieldQuota]), tonum(ARGV[a + fieldPeriod])
  if cost < 0 or cost > tonum(ARGV[a + fieldCapacity]) or ARGV[a + fieldWinStart] ~= '' then return nil end
  local w = windows[p]
  if not w then
    local ss, sn, off
    if p % 1000000000 == 0 then
      local q = p / 1000000000
      local m = fns % q
      ss, sn, off = fns - m, 0, m * 1000000000 + fnn
    elseif 1000000000 % p == 0 then
      local m = fnn % p
      ss, sn, off = fns, fnn - m, m
    else
      return nil
    end
    if ss < 1 then return nil end
    w = {string.format('%d%09d', ss, sn), p - off}
    windows[p] = w
  end
  local start, reset = w[1], w[2]
  local count, pp, g = 0, '0', 0
  if v then
    local t, n, pv, s, gs = string.match(v, '^1|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)$')
    if not gs or #s < 10 then return nil end
    if since(s) > 0 then return nil end -- a clock behind the state's
    if t == start then count = n + 0 end
    pp, g = pv, gs + 0
  end
  if count + cost > limit then
    return {0, reasonLimited, math.max(0, limit - count), reset, math.max(reset, 1)}, v -- in reply order
  end
  count = count + cost
  if count == 0 then return {1, reasonOK, limit, 0, 0}, v end
  if cost ~= 0 then
    if not fnow then fnow = string.format('%d%09d', fns, fnn) end
    v = string.format('1|%s|%d|%s|%s|%d', start, count, pp, fnow, (g + 1) % 1000000000)
    redis.call('SET', key, v, 'PX', px(math.ceil(reset / 1000000) + slack))
  end
  return {1, reasonOK, limit - count, reset, 0}, v
end

-- fast holds the fast paths by algorithm, as ARGV spells it.
local fast = {['0'] = fastGCRA, ['1'] = fastFixed}

local first = 1 + argHeader -- the first item's first field
if fns and ARGV[1 + argCount] == '1' and fast[ARGV[first + fieldAlg]] then
  local key = KEYS[tonumber(ARGV[first + fieldKey])]
  local res = fast[ARGV[first + fieldAlg]](first, key, redis.call('GET', key))
  if res then return res end
end

-- A reconciliation (counting.go): ARGV[1 + argCount] is "r", the header
-- is followed by the fields of one GCRA rule (its key and cost unused),
-- and those by one cost per key of KEYS, in order: the hits a replica
-- counted on each key since it last sent them (0: only a look). Each key
-- is decided on its own, on the fast path. The reply is one integer per
-- key: the key's debt in ns (its ResetAfter) once its hits are counted;
-- or -3 - debt when they were refused, being beyond the rule's capacity
-- (the debt is the key's, unchanged); or replyFar when the fast path does
-- not take the key, having written nothing for it: the caller sends that
-- key again as a request of its own.
if ARGV[1 + argCount] == 'r' then
  local out, c0 = {}, first + itemFields - 1
  local vals = redis.call('MGET', unpack(KEYS))
  for i = 1, #KEYS do
    local res = fns and fastGCRA(first, KEYS[i], vals[i], tonum(ARGV[c0 + i]))
    if not res then out[i] = replyFar
    elseif res[1] == 1 then out[i] = res[4]
    else out[i] = -3 - res[4] end
  end
  return out
end

-- A batch (see the end) whose leading requests are each one GCRA or fixed
-- window item is
-- decided here too, with one MGET for their states, until a request that
-- the fast path does not take; the general path goes on from there. A key
-- met again sees the value written for it before.
-- a is where a batched request starts (its number of items), and its item's
-- fields start at a + batchReqHeader.
local bout, ba, bi = nil, first, 1
if fns and string.sub(ARGV[1 + argCount], 1, 1) == '-' then
  local count = -tonumber(ARGV[1 + argCount])
  local keys = {}
  local a = first
  while #keys < count and #keys < 1000 and ARGV[a] == '1' and fast[ARGV[a + batchReqHeader + fieldAlg]] do -- unpack's bound
    keys[#keys + 1] = KEYS[#keys + 1] -- one key each, in order
    a = a + batchReqHeader + itemFields
  end
  bout = {}
  if #keys > 0 then
    local vals = redis.call('MGET', unpack(keys))
    local seen = {}
    a = first
    for i = 1, #keys do
      local key = keys[i]
      local v = seen[key]
      if v == nil then v = vals[i] end
      local res, nv = fast[ARGV[a + batchReqHeader + fieldAlg]](a + batchReqHeader, key, v)
      if not res then break end
      seen[key] = nv
      local o = #bout
      bout[o + 1] = replyFields -- batchReqHeader: the number of values
      for j = 1, replyFields do bout[o + 1 + j] = res[j] end
      a = a + batchReqHeader + itemFields
      bi = i + 1
    end
    if bi > count then return bout end
    ba = a
  end
end

local floor = math.floor
local E9 = 1000000000
local TWO53 = 9007199254740992
local MAXI = 9223372036854775807 -- rounds to 2^63 as a double

local mask = tonumber(ARGV[1 + argMask])
local function has(alg) return floor(mask / 2 ^ alg) % 2 == 1 end

local nows, nown
local function parse(str)
  if str == nil or str == '' then return 0, 0 end
  local neg = false
  if string.sub(str, 1, 1) == '-' then neg = true; str = string.sub(str, 2) end
  local len = #str
  local s, n = 0, tonumber(str)
  if len > 9 then
    s = tonumber(string.sub(str, 1, len - 9))
    n = tonumber(string.sub(str, len - 8))
  end
  if neg then
    if n > 0 then s = -s - 1; n = E9 - n else s = -s end
  end
  return s, n
end

if nowArg == '' then -- the server's TIME, read above
  nows, nown = fns, fnn
else
  nows, nown = parse(nowArg)
end

-- rel turns an instant into nanoseconds after now.
local function rel(s, n) return (s - nows) * E9 + (n - nown) end

-- abs turns nanoseconds after now into an instant.
local function abs(d)
  local q = floor(d / E9)
  local r = d - q * E9
  if r < 0 then q = q - 1; r = r + E9 elseif r >= E9 then q = q + 1; r = r - E9 end
  local s, n = nows + q, nown + r
  if n >= E9 then s = s + 1; n = n - E9 end
  return s, n
end

-- fmt prints an instant as a decimal int64, saturated.
local function fmt(s, n)
  if s > 9223372036 or (s == 9223372036 and n > 854775807) then return '9223372036854775807' end
  if s < -9223372037 or (s == -9223372037 and n < 145224192) then return '-9223372036854775808' end
  if s == 0 then return string.format('%d', n) end
  if s > 0 then return string.format('%d%09d', s, n) end
  if n == 0 then return string.format('-%d000000000', -s) end
  s, n = -s - 1, E9 - n
  if s == 0 then return string.format('-%d', n) end
  return string.format('-%d%09d', s, n)
end

local function relstr(str) return rel(parse(str)) end
local function absstr(d) return fmt(abs(d)) end

local imod, pmod
if has(1) or has(3) then
-- imod returns a mod b in [0, b) for integers a and b > 0.
imod = function(a, b)
  local r = a - floor(a / b) * b
  if r < 0 then r = r + b elseif r >= b then r = r - b end
  return r
end

-- pmod returns the instant (s, n) mod p, for p > 0 ns.
pmod = function(s, n, p)
  if p % E9 == 0 then return imod(s, p / E9) * E9 + n end
  local x = imod(s, p)
  if x * E9 < TWO53 then return imod(x * E9 + n, p) end
  local r = 0 -- x*E9 mod p by doubling; exact for p < 2^52
  for i = 29, 0, -1 do
    r = r * 2
    if r >= p then r = r - p end
    if floor(E9 / 2 ^ i) % 2 == 1 then
      r = r + x
      if r >= p then r = r - p end
    end
  end
  return imod(r + n, p)
end

end

-- idiv returns a/b truncated toward zero, for b > 0.
local function idiv(a, b)
  if a >= 0 then return floor(a / b) end
  return -floor(-a / b)
end

local mulDiv
if has(0) or has(3) then
-- mulDiv returns a*b/c rounded down (up when up is true) for a, b >= 0 and
-- c > 0, saturated to MAXI, exact when a*b < 2^53 or c < 2^52.
mulDiv = function(a, b, c, up)
  if a == 0 or b == 0 then return 0 end
  local p = a * b
  if p < TWO53 then
    local q = floor(p / c)
    if up and q * c < p then q = q + 1 end
    return q
  end
  if p / c >= MAXI then return MAXI end
  if c >= TWO53 / 2 or a >= TWO53 * 2 or b >= TWO53 * 2 then -- beyond exactness: round
    local q = floor(p / c)
    if up and q * c < p then q = q + 1 end
    return q
  end
  -- Long division of the 106-bit product, 18-bit limbs, one bit at a time.
  local B = 262144
  local a0, a1, a2 = a % B, floor(a / B) % B, floor(a / B / B)
  local b0, b1, b2 = b % B, floor(b / B) % B, floor(b / B / B)
  local l = {a0 * b0, a0 * b1 + a1 * b0, a0 * b2 + a1 * b1 + a2 * b0, a1 * b2 + a2 * b1, a2 * b2, 0}
  for i = 1, 5 do
    local carry = floor(l[i] / B)
    l[i] = l[i] - carry * B
    l[i + 1] = l[i + 1] + carry
  end
  local q, r = 0, 0
  for i = 6, 1, -1 do
    local limb = l[i]
    for k = 17, 0, -1 do
      r = r * 2 + floor(limb / 2 ^ k) % 2
      q = q * 2
      if r >= c then r = r - c; q = q + 1 end
    end
  end
  if up and r > 0 then q = q + 1 end
  return q
end

end

local function newd() return {allowed = false, reason = reasonOK, remaining = 0, reset = 0, retry = 0} end

-- Algorithms. Times are ns relative to the script's instant; now is the
-- instant decided at (later than it when the state has seen a later one),
-- and (ns_, nn_) is now as an instant, for window alignment. st is
-- {alg, t, n, p, seen, log}.

local ns_, nn_ = 0, 0

-- A GCRA state written at another interval (the rule's rate changed) has
-- its debt rescaled to the rule's, and d.rescaled set: a denial on it is
-- reasonRescaled, which the denial cache does not keep (denials.go).
local function gcra(r, st, now, cost, commit, d)
  local iv, capT = r.iv, r.capT
  local debt = 0
  if st.t > now then
    debt = st.t - now
    if st.n ~= 0 and st.n ~= iv then
      debt = math.min(mulDiv(debt, iv, st.n), MAXI / 4)
      d.rescaled = true
    end
  end
  if cost >= 0 then
    local nxt = debt + cost * iv
    if nxt > capT then
      d.retry = nxt - capT
      d.remaining = math.max(0, idiv(capT - debt, iv))
      d.reset = debt
      return
    end
    debt = nxt
  else
    debt = math.max(0, debt + cost * iv)
  end
  d.allowed = true
  d.remaining = math.max(0, idiv(capT - debt, iv))
  d.reset = debt
  if commit and cost ~= 0 then st.t = now + debt; st.n = iv end
end

local window, fixedWindow, slidingReset, slidingWindow
if has(1) or has(3) then
-- window returns the fixed window [start, end) that holds now.
window = function(r, now)
  if r.ws then return r.ws, r.we end
  local start = now - pmod(ns_, nn_, r.p)
  return start, start + r.p
end

fixedWindow = function(r, st, now, cost, commit, d)
  local start, e = window(r, now)
  local count = 0
  if st.t == start then count = st.n end
  d.reset = math.max(0, e - now)
  if cost >= 0 and count + cost > r.limit then
    d.retry = e - now
    d.remaining = math.max(0, r.limit - count)
    return
  end
  count = math.max(0, count + cost)
  d.allowed = true
  d.remaining = math.max(0, r.limit - count)
  if count == 0 then d.reset = 0 end
  if commit and cost ~= 0 then st.t = start; st.n = count; st.e = e end
end

slidingReset = function(cur, prev, toEnd, p)
  if cur > 0 then return math.max(0, toEnd) + p end
  if prev > 0 then return math.max(0, toEnd) end
  return 0
end

slidingWindow = function(r, st, now, cost, commit, d)
  local p = r.p
  local start = now - pmod(ns_, nn_, p)
  local cur, prev = 0, 0
  if st.t == start then cur, prev = st.n, st.p
  elseif st.t == start - p then prev = st.n end
  local elapsed = now - start
  local used = cur + mulDiv(prev, p - elapsed, p, true)
  local e = start + p
  if cost >= 0 and used + cost > r.limit then
    local need = r.limit - cost
    if cur <= need then
      d.retry = start + p - mulDiv(need - cur, p, prev) - now
    else
      d.retry = e - now + p - mulDiv(need, p, cur)
    end
    d.remaining = math.max(0, r.limit - used)
    d.reset = slidingReset(cur, prev, e - now, p)
    return
  end
  if cost < 0 then
    cur = cur + cost
    if cur < 0 then prev = math.max(0, prev + cur); cur = 0 end
  else
    cur = cur + cost
  end
  d.allowed = true
  d.remaining = math.max(0, r.limit - cur - mulDiv(prev, p - elapsed, p, true))
  d.reset = slidingReset(cur, prev, e - now, p)
  if commit and cost ~= 0 then st.t = start; st.n = cur; st.p = prev end
end

end

local slidingLog
if has(2) then
slidingLog = function(r, st, now, cost, commit, d)
  local p, log, used = r.p, st.log, st.n
  local k = 1
  while k <= #log and log[k].at <= now - p do
    used = used - log[k].c
    k = k + 1
  end
  local last = #log
  if cost >= 0 and used + cost > r.limit then
    local left = used + cost - r.limit
    for i = k, last do
      left = left - log[i].c
      if left <= 0 then d.retry = log[i].at + p - now; break end
    end
    d.remaining = math.max(0, r.limit - used)
    if last >= k then d.reset = log[last].at + p - now end
    return
  end
  d.allowed = true
  d.remaining = math.max(0, r.limit - math.max(0, used + cost))
  local newest = last
  if cost < 0 then -- a refund takes back the newest entries first
    local refund = -cost
    while refund > 0 and newest >= k and log[newest].c <= refund do
      refund = refund - log[newest].c
      newest = newest - 1
    end
  end
  if cost > 0 then d.reset = p
  elseif newest >= k then d.reset = log[newest].at + p - now end
  if not commit or cost == 0 then return end
  local kept = {}
  for i = k, last do kept[#kept + 1] = log[i] end
  if cost > 0 then
    local tail = kept[#kept]
    if tail and tail.at == now then
      kept[#kept] = {at = tail.at, c = tail.c + cost}
    else
      kept[#kept + 1] = {at = now, c = cost}
    end
  else
    local partial = math.max(0, used + cost) -- what the survivors must sum to
    local m = newest - k + 1
    for i = #kept, m + 1, -1 do kept[i] = nil end
    for i = 1, m do partial = partial - kept[i].c end
    if partial < 0 then kept[m] = {at = kept[m].at, c = kept[m].c + partial} end
  end
  st.log = kept
  st.n = math.max(0, used + cost)
end

end

local leakyBucket
if has(4) then
leakyBucket = function(r, st, now, cost, commit, d)
  local c, iv = r.cap, r.iv
  local level, last = st.n, st.t
  if level > 0 and now > last then
    local leaked = idiv(now - last, iv)
    if leaked >= level then level = 0
    else level = level - leaked; last = last + leaked * iv end
  end
  if level <= 0 then level = 0; last = now end
  local progress = math.max(0, now - last)
  if cost >= 0 and level + cost > c then
    d.retry = (level + cost - c) * iv - progress
    d.remaining = math.max(0, c - level)
    d.reset = math.max(0, level * iv - progress)
    return
  end
  level = math.max(0, level + cost)
  if level == 0 then last = now end
  d.allowed = true
  d.remaining = math.max(0, c - level)
  d.reset = math.max(0, level * iv - progress)
  if commit and cost ~= 0 then st.t = last; st.n = level end
end

end

local algos = {[0] = gcra, [1] = fixedWindow, [2] = slidingLog, [3] = slidingWindow, [4] = leakyBucket}

-- decide is ratelimit's Rule.decide on a state of the rule's algorithm.
local function decide(r, st, cost, commit)
  local d = newd()
  local now, lag = 0, 0
  ns_, nn_ = nows, nown
  if st.seen > 0 then -- a caller whose clock lags is answered at the state's instant
    lag, now = st.seen, st.seen
    ns_, nn_ = st.ss, st.sn
  end
  if cost > r.cap then
    algos[r.alg](r, st, now, 0, false, d)
    d.allowed, d.reason, d.retry = false, reasonExceeds, 0
  else
    if cost < -r.cap then cost = -r.cap end
    algos[r.alg](r, st, now, cost, commit, d)
    if not d.allowed then
      d.reason = reasonLimited
      if d.rescaled then d.reason = reasonRescaled end
      d.retry = lag + math.max(d.retry, 1)
    elseif commit and cost ~= 0 then
      st.seen, st.ss, st.sn = now, ns_, nn_
    end
  end
  if d.reset > 0 then d.reset = d.reset + lag end
  return d
end

-- State I/O.

local ZREL = rel(0, 0) -- the instant 0 (a fresh state's times), relative

local function fresh(alg)
  return {alg = alg, t = ZREL, n = 0, p = 0, seen = ZREL, ss = 0, sn = 0, e = 0, g = 0,
    log = {}, stale = true, logLoaded = true}
end

-- load reads the state of key as stored, whatever its algorithm; a sliding
-- log's entries are read by loadLog.
local function load(key)
  local v = redis.call('GET', key)
  if not v then return fresh(-1) end
  local alg, t, n, p, seen, g = string.match(v, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
  if not g then return fresh(-1) end -- not a state this script wrote: overwritten
  local st = {alg = tonumber(alg), t = relstr(t), n = tonumber(n), p = tonumber(p), g = tonumber(g), e = 0, log = {}}
  st.ss, st.sn = parse(seen)
  st.seen = rel(st.ss, st.sn)
  return st
end

local function loadLog(st, logkey)
  if st.logLoaded then return end
  st.logLoaded = true
  if st.stale then return end
  local raw = redis.call('LRANGE', logkey, 0, -1)
  for i = 1, #raw do
    local at, c = string.match(raw[i], '^([^:]+):(.+)$')
    st.log[i] = {at = relstr(at), c = tonumber(c), idx = i - 1}
  end
end

-- far reports whether st, as r sees it, holds a distance from now that
-- doubles cannot hold exactly (written under a much longer rule, or by a
-- clock far ahead), or needs a calendar window Go did not send: Go then
-- decides with exact integers.
local LIM = 4503599627370496 -- 2^52
local function far(st, r)
  if st.alg ~= r.alg then return false end
  if st.t >= LIM or st.seen >= LIM then return true end
  if r.ws and st.seen >= r.we then return true end
  if st.alg == 0 and st.t > st.seen and st.n >= LIM then return true end
  if st.alg == 4 and st.n * r.iv >= LIM then return true end
  if st.alg == 2 and #st.log > 0 and st.log[#st.log].at >= LIM then return true end
  return false
end

local function copy(st)
  local c = {}
  for k, v in pairs(st) do c[k] = v end
  local log = {}
  for i = 1, #st.log do log[i] = st.log[i] end
  c.log = log
  return c
end

-- view returns st as the rule's algorithm sees it: a state of another
-- algorithm is a fresh one.
local function view(st, alg, logkey)
  if st.alg ~= alg then
    local f = fresh(alg)
    f.g = st.g
    return f
  end
  if logkey then loadLog(st, logkey) end
  return st
end

-- freshAt is when st becomes equivalent to a fresh state, relative to now.
local function freshAt(r, st)
  local a = st.alg
  if a == 0 then return st.t end
  if a == 1 then if st.n > 0 then return st.e end return 0 end
  if a == 3 then
    if st.n > 0 then return st.t + 2 * r.p end
    if st.p > 0 then return st.t + r.p end
    return 0
  end
  if a == 2 then if #st.log > 0 then return st.log[#st.log].at + r.p end return 0 end
  if st.n > 0 then return st.t + st.n * r.iv end
  return 0
end

local function num(x) return string.format('%.0f', x) end
local function tstr(d)
  if d == ZREL then return '0' end
  return absstr(d)
end

local function store(key, logkey, r, st)
  local ttl = freshAt(r, st)
  if ttl <= 0 and slack == 0 then -- with a client clock, keep it for the slack
    redis.call('DEL', key)
    if logkey then redis.call('DEL', logkey) end
    return
  end
  local ms = math.min(math.ceil(math.max(ttl, 0) / 1000000) + slack, 5000000000000)
  local g = (st.g + 1) % 1125899906842624 -- a generation: every write changes the value
  local seen = '0'
  if st.seen ~= ZREL then seen = fmt(st.ss, st.sn) end
  redis.call('SET', key, table.concat({st.alg, tstr(st.t), num(st.n), num(st.p), seen, num(g)}, '|'), 'PX', ms)
  if st.alg ~= 2 then return end
  -- Entries loaded and unchanged form one run of the stored list (pruning
  -- removes from the head, changes happen at the tail): keep it, push the rest.
  local new = st.log
  local skip, same = 0, 0
  if not st.stale and #new > 0 and new[1].idx then
    skip = new[1].idx
    while same < #new and new[same + 1].idx == skip + same do same = same + 1 end
  end
  if same == 0 then
    redis.call('DEL', logkey)
  else
    redis.call('LTRIM', logkey, skip, skip + same - 1)
  end
  local buf = {}
  for i = same + 1, #new do
    buf[#buf + 1] = absstr(new[i].at) .. ':' .. num(new[i].c)
    if #buf == 1000 then redis.call('RPUSH', logkey, unpack(buf)); buf = {} end
  end
  if #buf > 0 then redis.call('RPUSH', logkey, unpack(buf)) end
  redis.call('PEXPIRE', logkey, ms)
end

-- Main: pass 1 decides every item in order against working states (so the
-- same key twice sees its first consumption), stopping at the first denial;
-- pass 2 writes the working states back only if every item was admitted.

local function clamp(x)
  if x ~= x then return 0 end
  if x > maxDuration then return maxDuration end
  if x < -maxDuration then return -maxDuration end
  return x
end

-- reply appends d's replyFields values to res and returns res.
local function reply(res, d)
  local al = 0
  if d.allowed then al = 1 end
  local o = #res + 1
  res[o + replyAllowed], res[o + replyReason] = al, d.reason
  res[o + replyRemaining], res[o + replyReset], res[o + replyRetry] = clamp(d.remaining), clamp(d.reset), clamp(d.retry)
  return res
end

-- item reads the item whose fields start at ARGV[a].
local function item(a)
  local r = {
    alg = tonumber(ARGV[a + fieldAlg]), limit = tonumber(ARGV[a + fieldQuota]), cap = tonumber(ARGV[a + fieldCapacity]),
    iv = tonumber(ARGV[a + fieldInterval]), capT = tonumber(ARGV[a + fieldCapT]), p = tonumber(ARGV[a + fieldPeriod]),
  }
  if ARGV[a + fieldWinStart] ~= '' then r.ws, r.we = relstr(ARGV[a + fieldWinStart]), relstr(ARGV[a + fieldWinEnd]) end
  local ki = tonumber(ARGV[a + fieldKey])
  local logkey = nil
  if r.alg == 2 then logkey = KEYS[ki + 1] end
  return r, tonumber(ARGV[a + fieldCost]), KEYS[ki], logkey
end

-- request decides the n items whose fields start at ARGV[a], all or
-- nothing, and returns replyFields values per item, or {replyFar} having
-- written nothing.
local function request(a, n)
  if n == 1 then -- the common case, without the bookkeeping of several items
    local r, cost, key, logkey = item(a)
    local st = view(load(key), r.alg, logkey)
    if far(st, r) then return {replyFar} end
    local d = decide(r, st, cost, true)
    if d.allowed and cost ~= 0 then store(key, logkey, r, st) end
    return reply({}, d)
  end

  local items, orig, work = {}, {}, {}
  local out = {}
  local denied = nil
  for i = 1, n do
    local r, cost, key, logkey = item(a + itemFields * (i - 1))
    items[i] = {r = r, cost = cost, key = key, logkey = logkey}
    if not denied then
      if not orig[key] then orig[key] = load(key) end
      if not work[key] then work[key] = copy(orig[key]) end
      local w = work[key]
      local v = w
      if w.alg ~= r.alg then -- another algorithm's state: decide on a fresh one
        v = fresh(r.alg)
        v.g = w.g
      elseif logkey and not w.logLoaded then -- the stored log, read once
        loadLog(orig[key], logkey)
        w.log = copy(orig[key]).log
        w.logLoaded = true
      end
      if far(v, r) then return {replyFar} end
      local d = decide(r, v, cost, true)
      out[i] = d
      if not d.allowed then
        denied = i
      elseif cost ~= 0 then -- committed: v is the key's state now
        v.dirty, v.rule = true, r
        if logkey then v.logkey = logkey end
        work[key] = v
      end
    end
  end

  if denied then
    -- Nothing is consumed. Each other item reports what it alone would get.
    for i = 1, n do
      if i ~= denied then
        local it = items[i]
        local o = orig[it.key]
        if not o then o = load(it.key); orig[it.key] = o end
        local st = copy(view(o, it.r.alg, it.logkey))
        if far(st, it.r) then return {replyFar} end
        local d = decide(it.r, st, it.cost, false)
        if d.allowed then d = decide(it.r, st, 0, false) end
        out[i] = d
      end
    end
  else
    for key, st in pairs(work) do
      if st.dirty then store(key, st.logkey, st.rule, st) end
    end
  end

  local res = {}
  for i = 1, n do reply(res, out[i]) end
  return res
end

local n = ARGV[1 + argCount]
if string.sub(n, 1, 1) ~= '-' then return request(first, tonumber(n)) end

-- A batch: ARGV[1 + argCount] is minus the number of requests, each given
-- as its number of items (batchReqHeader) and then the items' fields. The
-- reply is, per request, the number of its values and then the values.
-- Each request sees the writes of the ones before it, as if they had come
-- one by one. The requests before the bi-th were decided at the top (their
-- replies in bout).
local out = bout or {}
local a = ba
for _ = bi, -tonumber(n) do
  local m = tonumber(ARGV[a])
  local f = a + batchReqHeader -- its first item's first field
  local res = nil
  if m == 1 and fns and fast[ARGV[f + fieldAlg]] then
    local key = KEYS[tonumber(ARGV[f + fieldKey])]
    res = fast[ARGV[f + fieldAlg]](f, key, redis.call('GET', key))
  end
  if not res then res = request(f, m) end
  out[#out + 1] = #res
  for i = 1, #res do out[#out + 1] = res[i] end
  a = f + itemFields * m
end
return out
