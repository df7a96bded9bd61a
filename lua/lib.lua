-- lib.lua: the limit algorithms, shared by every tollgate script.
--
-- Not run on its own: the gateway prepends it to each entry script (reserve.lua,
-- settle.lua, semaphore.lua, lease.lua), so every script is one atomic EVALSHA
-- with no check-then-act across calls. All keys one script touches belong to one
-- limit scope and carry the same {hash tag}, so scripts work on Redis Cluster.
--
-- Time: Redis TIME, in milliseconds (now_ms), so every node agrees (no gateway clock
-- enters a decision). Numbers are Lua doubles: exact up to 2^53, and every amount
-- is bounded by 2^50 by the gateway.
--
-- Algorithms (each with check / commit / settle; retry-after in ms, -1 = never):
--   win_*  bucketed sliding window, a ring of R = ceil(W/w) + 1 buckets in one HASH
--          with a running sum: O(1) per call (amortised; at most R slots are
--          recycled after a long idle period). A bucket counts until its end has
--          left the window, the gateway's conservative rule.
--   gcra_* generic cell rate (token bucket): one STRING holding the theoretical
--          arrival time in microseconds. O(1).
--   log_*  exact sliding log: a ZSET of "<id>:<cost>" scored by time, O(n) in the
--          entries of one window, with a correct retry-after: the time until
--          enough cost has left the window, not just the oldest entry.
--   sem_*  concurrency semaphore: a ZSET of permit ids scored by expiry; expired
--          (ghost) slots are removed before every acquire. O(log n).

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- ---------------------------------------------------------------- window ----
-- HASH fields: h = head bucket, s = sum, b<slot> = bucket id, c<slot> = count.

local function win_ring(window_ms, bucket_ms)
  return math.ceil(window_ms / bucket_ms) + 1
end

-- Reads the window with one HMGET (head, sum and the current bucket's slot) and,
-- when a new bucket started, recycles the slots of buckets that stopped counting
-- and stores the new head and sum. Returns the state {head, sum, count (the
-- current bucket's)}.
local function win_load(key, window_ms, bucket_ms, now)
  local ring = win_ring(window_ms, bucket_ms)
  local nb = math.floor(now / bucket_ms)
  local slot = nb % ring
  local st = redis.call('HMGET', key, 'h', 's', 'b' .. slot, 'c' .. slot)
  local head, sum = tonumber(st[1]), tonumber(st[2]) or 0
  if head == nil then
    return { head = nb, sum = 0, count = 0, renew = true }
  end
  if nb <= head then
    -- Same bucket (or Redis time went back after a failover: count into the head).
    local count = 0
    if nb == head and st[3] and tonumber(st[3]) == head then
      count = tonumber(st[4]) or 0
    elseif nb < head then
      local f = redis.call('HMGET', key, 'b' .. (head % ring), 'c' .. (head % ring))
      if f[1] and tonumber(f[1]) == head then count = tonumber(f[2]) or 0 end
    end
    return { head = head, sum = sum, count = count }
  end
  local steps = math.min(nb - head, ring)
  local dropped = {}
  for b = nb - steps + 1, nb do
    local s = b % ring
    local f
    if s == slot then f = { st[3], st[4] } else f = redis.call('HMGET', key, 'b' .. s, 'c' .. s) end
    if f[1] and tonumber(f[1]) ~= b then
      sum = sum - (tonumber(f[2]) or 0)
      dropped[#dropped + 1] = 'b' .. s
      dropped[#dropped + 1] = 'c' .. s
    end
  end
  if #dropped > 0 then redis.call('HDEL', key, unpack(dropped)) end
  if sum < 0 then sum = 0 end
  -- Written at once (once per bucket), so a refused call leaves a consistent sum.
  redis.call('HSET', key, 'h', nb, 's', sum)
  return { head = nb, sum = sum, count = 0, renew = true }
end

-- Advances the window to now; returns head, sum. A new bucket pushes the expiry
-- back here too: a commit later in the same bucket does not (it sees no new
-- bucket), so the key must already live a window past this one.
local function win_advance(key, window_ms, bucket_ms, now)
  local st = win_load(key, window_ms, bucket_ms, now)
  if st.renew then redis.call('PEXPIRE', key, window_ms + 2 * bucket_ms) end
  return st.head, st.sum
end

-- 0 when cost fits the state read by win_load, else ms until enough has left the
-- window (-1: never).
local function win_check_state(key, st, cap, window_ms, bucket_ms, cost, now)
  if cost > cap then return -1 end
  if st.sum + cost <= cap then return 0 end
  local ring = win_ring(window_ms, bucket_ms)
  local need, freed = st.sum + cost - cap, 0
  for b = st.head - ring + 1, st.head do
    local slot = b % ring
    local f = redis.call('HMGET', key, 'b' .. slot, 'c' .. slot)
    if f[1] and tonumber(f[1]) == b then
      freed = freed + (tonumber(f[2]) or 0)
      if freed >= need then
        -- Bucket b counts until (b + 1) * w + W.
        return math.max(1, (b + 1) * bucket_ms + window_ms - now)
      end
    end
  end
  return math.max(1, window_ms)
end

-- Charges cost to the current bucket of the state read by win_load (one HSET; the
-- expiry is pushed back once per bucket, which is enough for a key that lives a
-- window after its last write); returns the bucket id (the settle ref).
local function win_commit_state(key, st, window_ms, bucket_ms, cost)
  local slot = st.head % win_ring(window_ms, bucket_ms)
  redis.call('HSET', key, 'h', st.head, 's', st.sum + cost, 'b' .. slot, st.head,
    'c' .. slot, st.count + cost)
  if st.renew then
    redis.call('PEXPIRE', key, window_ms + 2 * bucket_ms)
    st.renew = false
  end
  st.sum, st.count = st.sum + cost, st.count + cost
  return st.head
end

-- Corrects the reservation in bucket `bucket` by delta (refund < 0, debt > 0);
-- a bucket that left the window no longer counts and is left alone.
local function win_settle(key, window_ms, bucket_ms, bucket, delta, now)
  local ring = win_ring(window_ms, bucket_ms)
  win_advance(key, window_ms, bucket_ms, now)
  local slot = bucket % ring
  local f = redis.call('HMGET', key, 'b' .. slot, 'c' .. slot, 's')
  if not f[1] or tonumber(f[1]) ~= bucket then return 0 end
  local count = tonumber(f[2]) or 0
  local new = math.max(0, count + delta)
  redis.call('HSET', key, 'c' .. slot, new, 's', math.max(0, (tonumber(f[3]) or 0) + new - count))
  return new - count
end

-- Adds cost to bucket `bucket` if it still counts (reconciling spending made
-- while Redis was unreachable); returns what was added.
local function win_charge(key, window_ms, bucket_ms, bucket, cost, now)
  local ring = win_ring(window_ms, bucket_ms)
  local head = win_advance(key, window_ms, bucket_ms, now)
  if bucket > head or (bucket + 1) * bucket_ms + window_ms <= now then return 0 end
  local slot = bucket % ring
  local f = redis.call('HMGET', key, 'b' .. slot, 'c' .. slot, 's')
  local count, sum = 0, tonumber(f[3]) or 0
  if f[1] and tonumber(f[1]) == bucket then
    count = tonumber(f[2]) or 0
  elseif f[1] then
    -- The slot holds another (older) bucket that no longer counts.
    sum = sum - (tonumber(f[2]) or 0)
  end
  redis.call('HSET', key, 'h', head, 'b' .. slot, bucket, 'c' .. slot, count + cost,
    's', math.max(0, sum) + cost)
  redis.call('PEXPIRE', key, window_ms + 2 * bucket_ms)
  return cost
end

-- ------------------------------------------------------------------ gcra ----
-- STRING: theoretical arrival time (us). Emission interval T = W / cap; a
-- request of cost c fits while tat + c*T - now <= burst * T.

local function gcra_check(key, cap, window_ms, burst, cost, now)
  if cost > burst then return -1 end
  local t = window_ms * 1000 / cap
  local now_us = now * 1000
  local tat = math.max(tonumber(redis.call('GET', key)) or now_us, now_us)
  local over = tat + cost * t - now_us - burst * t
  if over <= 0 then return 0 end
  return math.max(1, math.ceil(over / 1000))
end

local function gcra_commit(key, cap, window_ms, cost, now)
  local t = window_ms * 1000 / cap
  local now_us = now * 1000
  local tat = math.max(tonumber(redis.call('GET', key)) or now_us, now_us)
  redis.call('SET', key, tat + cost * t, 'PX', window_ms * 2)
  return 0
end

local function gcra_settle(key, cap, window_ms, delta, now)
  local t = window_ms * 1000 / cap
  local now_us = now * 1000
  local tat = tonumber(redis.call('GET', key))
  if tat == nil then return 0 end
  local new = math.max(now_us, tat + delta * t)
  redis.call('SET', key, new, 'PX', window_ms * 2)
  return delta
end

-- ------------------------------------------------------------------- log ----
-- ZSET of "<id>:<cost>" scored by admission time (ms); an entry at t counts while
-- t + W > now. The id comes from a counter in the same slot (key .. ':id').

local function log_entries(key, window_ms, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window_ms)
  return redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
end

local function log_cost(member)
  return tonumber(string.match(member, ':(%d+)$')) or 0
end

local function log_check(key, cap, window_ms, cost, now)
  if cost > cap then return -1 end
  local e = log_entries(key, window_ms, now)
  local used = 0
  for i = 1, #e, 2 do used = used + log_cost(e[i]) end
  if used + cost <= cap then return 0 end
  local need, freed = used + cost - cap, 0
  for i = 1, #e, 2 do
    freed = freed + log_cost(e[i])
    if freed >= need then
      return math.max(1, tonumber(e[i + 1]) + window_ms - now)
    end
  end
  return window_ms
end

local function log_commit(key, window_ms, cost, now)
  local id = redis.call('INCR', key .. ':id')
  local member = id .. ':' .. cost
  redis.call('ZADD', key, now, member)
  redis.call('PEXPIRE', key, window_ms + 1000)
  redis.call('PEXPIRE', key .. ':id', window_ms + 1000)
  return member
end

-- Replaces the entry `member` by one with its corrected cost, same time.
local function log_settle(key, window_ms, member, actual, now)
  local score = redis.call('ZSCORE', key, member)
  if not score then return 0 end
  local old = log_cost(member)
  redis.call('ZREM', key, member)
  if actual > 0 then
    local id = string.match(member, '^(%d+):')
    redis.call('ZADD', key, score, id .. ':' .. actual)
  end
  return actual - old
end

-- ------------------------------------------------------------- semaphore ----

local function sem_check(key, cap, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if redis.call('ZCARD', key) < cap then return 0 end
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] then return math.max(1, tonumber(first[2]) - now) end
  return 1000
end

local function sem_commit(key, id, ttl_ms, now)
  redis.call('ZADD', key, now + ttl_ms, id)
  redis.call('PEXPIRE', key, ttl_ms * 2)
  return id
end

-- Dispatch on an algorithm name, so entry scripts stay algorithm-agnostic.
-- spec = { alg, key, cap, window_ms, p (bucket_ms or burst) }
local function dim_check(d, cost, now)
  if d.alg == 'window' then
    -- One read per window; the commit reuses it (one HMGET + one HSET per call).
    d.st = win_load(d.key, d.window_ms, d.p, now)
    return win_check_state(d.key, d.st, d.cap, d.window_ms, d.p, cost, now)
  end
  if d.alg == 'gcra' then return gcra_check(d.key, d.cap, d.window_ms, d.p, cost, now) end
  if d.alg == 'log' then return log_check(d.key, d.cap, d.window_ms, cost, now) end
  return redis.error_reply('unknown algorithm ' .. tostring(d.alg))
end

local function dim_commit(d, cost, now)
  if d.alg == 'window' then return win_commit_state(d.key, d.st, d.window_ms, d.p, cost) end
  if d.alg == 'gcra' then return gcra_commit(d.key, d.cap, d.window_ms, cost, now) end
  return log_commit(d.key, d.window_ms, cost, now)
end

local function dim_settle(d, ref, reserved, actual, now)
  if d.alg == 'window' then
    return win_settle(d.key, d.window_ms, d.p, tonumber(ref), actual - reserved, now)
  end
  if d.alg == 'gcra' then return gcra_settle(d.key, d.cap, d.window_ms, actual - reserved, now) end
  return log_settle(d.key, d.window_ms, ref, actual, now)
end

-- Settles a reservation the upstream answered `ago` ms before now (-1: never
-- answered, settled in place). The provider counts a request when it arrives,
-- which happened by the answer at the latest, so the cost leaves the admission
-- bucket (or log entry) and `actual` is charged at the answer's time: left where
-- it was, it would leave this window before the provider's whenever the way there
-- took longer than what was left of its bucket. A charge whose place already left
-- the window is charged again while the answer's time still counts. gcra has no
-- window: settled in place. Returns the net correction.
local function dim_settle_at(d, ref, reserved, actual, ago, now)
  if ago < 0 or d.alg == 'gcra' then
    if reserved == actual then return 0 end
    return dim_settle(d, ref, reserved, actual, now)
  end
  local at = now - ago
  if d.alg == 'window' then
    local old, bucket = tonumber(ref), math.floor(at / d.p)
    if bucket <= old then
      if reserved == actual then return 0 end
      return win_settle(d.key, d.window_ms, d.p, old, actual - reserved, now)
    end
    local removed = win_settle(d.key, d.window_ms, d.p, old, -reserved, now)
    return removed + win_charge(d.key, d.window_ms, d.p, bucket, actual, now)
  end
  local score = tonumber(redis.call('ZSCORE', d.key, ref))
  local old = 0
  if score then
    old = log_cost(ref)
    redis.call('ZREM', d.key, ref)
  end
  if actual > 0 and at + d.window_ms > now then
    local id = string.match(ref, '^(%d+):')
    redis.call('ZADD', d.key, math.max(at, score or at), id .. ':' .. actual)
    redis.call('PEXPIRE', d.key, d.window_ms + 1000)
    return actual - old
  end
  return -old
end

-- Reads a dimension spec from ARGV starting at i: alg, cap, window_ms, p.
local function read_dim(key, i)
  return { alg = ARGV[i], key = key, cap = tonumber(ARGV[i + 1]),
           window_ms = tonumber(ARGV[i + 2]), p = tonumber(ARGV[i + 3]) }
end
