-- lease.lua: `redis-lease` mode's owner: the credit line of one holder for one
-- limit key (docs/design/lease.md, with Redis as the owner). One call is a full
-- statement: it replaces what Redis knew of the holder, grants more if the key
-- has room, and answers with the holder's whole credit for one ttl. Renewal,
-- report, return (want = 0, remaining = 0) are the same call.
--
-- KEYS[1] the key's HASH: holder id -> JSON account
--         {u = usage by bucket, c = credit, t = until ms, x = expired by bucket,
--          s = seq, f = reservation}
-- ARGV[1] holder id, ARGV[2] kind ('window' | 'slots'), ARGV[3] cap L,
-- ARGV[4] window_ms, ARGV[5] bucket_ms, ARGV[6] max_credit, ARGV[7] ttl_ms,
-- ARGV[8] seq (only grows per holder), ARGV[9] remaining credit (slots: in use),
-- ARGV[10] want, ARGV[11] the reservation the holder asks for (its
--         demand-weighted share of L from gossip; -1 = no reservation and no cap),
-- ARGV[12] borrow: how far beyond its reservation it may commit (only from room
--         nobody has reserved), ARGV[13] skew tolerance ms: a holder whose clock
--         (seq) runs further behind Redis TIME has its buckets shifted forward by
--         the rest, rounded up to buckets (they would leave the window early),
--         ARGV[14] n = number of held members, then n pairs (member id, floor):
--         members that announced over gossip they lost Redis or that gossip
--         cannot reach; their reservation is kept and charged however stale their
--         account, and one with no account at all (the key expired while nobody
--         stated) is charged its floor (its share in the caller's view); then
--         (bucket, cost) pairs: the holder's usage.
-- Returns {credit, granted, ttl_ms, reservation, Redis TIME in ms} or
--   {-1, reason} ('stale') with nothing changed.
-- Reservations: a holder's reservation is what it may spend per window if Redis
--   is lost (its cut-off share). Every holder's charge is at least its reservation,
--   and the script keeps sum of charges <= L, so when Redis goes away every node
--   spending up to its own reservation (or its credit) keeps the cluster <= L even
--   though the nodes' gossip views of the shares differ (with each node taking its
--   share from its own view, the jepsen harness sees 41 of 40). A holder's
--   charge: its usage in the window + expired credit in the window + unexpired
--   credit (slots: unexpired slots), at least its reservation while its account
--   is live or held.
-- Complexity: O(holders x buckets), a few holders of at most R buckets each.

local now = now_ms()
local key, me_id, kind = KEYS[1], ARGV[1], ARGV[2]
local cap, window_ms, bucket_ms = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local max_credit, ttl, seq = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local remaining, want = tonumber(ARGV[9]), tonumber(ARGV[10])
local ask, borrow = tonumber(ARGV[11]), tonumber(ARGV[12])
local tolerance, n_held = tonumber(ARGV[13]), tonumber(ARGV[14])
local held = {}
for i = 0, n_held - 1 do held[ARGV[15 + 2 * i]] = tonumber(ARGV[16 + 2 * i]) end
local shift = math.max(0, math.ceil((now - seq - tolerance) / bucket_ms))
local windowed = kind == 'window'
local now_b = math.floor(now / bucket_ms)

local function counts(b) return (b + 1) * bucket_ms + window_ms > now end
local function sum_in_window(m)
  local s = 0
  for b, c in pairs(m) do if counts(tonumber(b)) then s = s + c end end
  return s
end

local accounts = {}
local raw = redis.call('HGETALL', key)
for i = 1, #raw, 2 do accounts[raw[i]] = cjson.decode(raw[i + 1]) end
-- Expired credit counts as spent in the bucket of its expiry; drop what left.
for _, a in pairs(accounts) do
  if a.t <= now and a.c > 0 then
    if windowed then
      local b = tostring(math.floor(a.t / bucket_ms))
      a.x[b] = (a.x[b] or 0) + a.c
    end
    a.c = 0
  end
  for b in pairs(a.u) do if not counts(tonumber(b)) then a.u[b] = nil end end
  for b in pairs(a.x) do if not counts(tonumber(b)) then a.x[b] = nil end end
end
local function charge(a)
  local credit = (a.t > now) and a.c or 0
  if not windowed then return credit end
  return sum_in_window(a.u) + sum_in_window(a.x) + credit
end
-- A reservation lapses once its holder has stopped stating for a ttl beyond its
-- credit's end (idle keys return theirs), unless the holder is held: it may be
-- spending it without Redis. The extra ttl covers the time peers take to list a
-- holder that lost Redis (or gossip) as held: the ttl is at least the
-- failure-detection time, and a holder that has not stated for it has long
-- announced its loss.
for id, a in pairs(accounts) do
  if not (a.t + ttl > now or held[id]) then a.f = 0 end
end

local me = accounts[me_id]
if me and seq <= me.s then return { -1, 'stale' } end

local usage, used = {}, 0
if windowed then
  for i = 15 + 2 * n_held, #ARGV, 2 do
    local b, c = math.min(tonumber(ARGV[i]) + shift, now_b), tonumber(ARGV[i + 1])
    if counts(b) and c > 0 then
      usage[tostring(b)] = (usage[tostring(b)] or 0) + c
      used = used + c
    end
  end
end
local accepted
if not windowed then
  accepted = remaining
elseif me then
  -- Conservation: a statement cannot raise the holder's commitment.
  local live = sum_in_window(me.u) + ((me.t > now) and me.c or 0)
  accepted = math.min(remaining, math.max(0, live - used))
else
  accepted = math.min(remaining, max_credit)
end

local others = 0
for id, a in pairs(accounts) do
  if id ~= me_id then others = others + math.max(charge(a), a.f or 0) end
end
for id, floor in pairs(held) do
  if id ~= me_id and not accounts[id] then others = others + floor end
end
local expired = me and (windowed and sum_in_window(me.x) or 0) or 0
local mine = used + expired + accepted
local free = cap - others
-- The reservation fits what the others are charged (they may hold more than
-- their own reservations while their usage ages out).
local reserved = 0
if ask >= 0 then reserved = math.max(0, math.min(ask, free)) end
local room = math.min(want, free - mine, math.max(max_credit, want) - accepted)
if ask >= 0 then room = math.min(room, reserved + borrow - mine) end
local granted = math.max(0, room)

local account = { u = usage, c = accepted + granted, t = now + ttl,
                  x = me and me.x or {}, s = seq, f = reserved }
accounts[me_id] = account
for id, a in pairs(accounts) do
  if a.c > 0 or next(a.u) or next(a.x) or a.t > now or (a.f or 0) > 0 then
    -- An empty table encodes as {} (cjson), which decodes back to a table.
    redis.call('HSET', key, id, cjson.encode(a))
  else
    redis.call('HDEL', key, id)
  end
end
redis.call('PEXPIRE', key, window_ms + 2 * ttl)
return { accepted + granted, granted, ttl, reserved, now }
