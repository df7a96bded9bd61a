-- reserve.lua: admits n requests of one limit scope (n = 1: a request alone), each
-- on every dimension or on none (checks first, then commits), decided in order as
-- n separate calls would be: a refused one charges nothing and the next is still
-- tried. The gateway sends the reservations that queued behind a call in flight
-- for the same scope together (src/redis/batch.rs), so a hot scope pays the
-- per-call cost (EVALSHA, TIME, reading the windows) once per batch instead of
-- once per request.
--
-- KEYS[1..6] the window keys: requests, tokens, input tokens, output tokens,
--            requests per day, tokens per day;
-- KEYS[7]    the concurrency semaphore key (all with the same {scope} hash tag)
-- ARGV[1]      n, the number of reservations (1..64)
-- ARGV[2..25]  per window, four: alg ('window' | 'gcra' | 'log' | 'none'), cap,
--              window_ms, bucket_ms (window) or burst (gcra); each window has
--              its own length (the day's are longer)
-- ARGV[26]     concurrency cap (0: none)
-- ARGV[27 + 5(i-1) ..] for reservation i: its tokens, input tokens and output
--              tokens (a request costs 1 on the request windows), permit id,
--              slot ttl in ms
-- Returns n answers, each {1, ref per window (6), now_ms} or {0, dimension,
--   retry_after_ms}; a window's ref is an integer (its bucket id), the others
--   strings ('0' for none).
-- Complexity: O(n) for window and gcra (a window is read once and written once
--   per call, however large n), O(n x entries) for log, O(n log m) for the
--   semaphore.

local now = now_ms()
local n = tonumber(ARGV[1])
local names = { 'requests', 'tokens', 'input_tokens', 'output_tokens',
  'requests_per_day', 'tokens_per_day' }
local dims = {}
for j, name in ipairs(names) do
  dims[j] = { name = name, spec = read_dim(KEYS[j], 2 + 4 * (j - 1)) }
end
local conc = tonumber(ARGV[26])
-- Windows: read once; decisions update the state in memory; written once below.
for _, d in ipairs(dims) do
  local s = d.spec
  if s.alg == 'window' then s.st = win_load(s.key, s.window_ms, s.p, now) end
end

local function flush(s)
  if s.dirty then
    local slot = s.st.head % win_ring(s.window_ms, s.p)
    redis.call('HSET', s.key, 'h', s.st.head, 's', s.st.sum, 'b' .. slot, s.st.head,
      'c' .. slot, s.st.count)
    if s.st.renew then
      redis.call('PEXPIRE', s.key, s.window_ms + 2 * s.p)
      s.st.renew = false
    end
    s.dirty = false
  end
end

local function check(s, cost)
  if s.alg ~= 'window' then return dim_check(s, cost, now) end
  if cost > s.cap then return -1 end
  if s.st.sum + cost <= s.cap then return 0 end
  -- The retry-after scan reads the buckets from Redis: write what this call
  -- charged first.
  flush(s)
  return win_check_state(s.key, s.st, s.cap, s.window_ms, s.p, cost, now)
end

local function commit(s, cost)
  if s.alg ~= 'window' then return dim_commit(s, cost, now) end
  s.st.sum, s.st.count, s.dirty = s.st.sum + cost, s.st.count + cost, true
  return s.st.head
end

local out = {}
for i = 1, n do
  local base = 27 + 5 * (i - 1)
  local tokens = tonumber(ARGV[base])
  local costs = { 1, tokens, tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), 1, tokens }
  local worst = nil
  for j, d in ipairs(dims) do
    if d.spec.alg ~= 'none' then
      local retry = check(d.spec, costs[j])
      if retry ~= 0 and (worst == nil or retry == -1 or (worst[3] ~= -1 and retry > worst[3])) then
        worst = { 0, d.name, retry }
      end
    end
  end
  if conc > 0 then
    local retry = sem_check(KEYS[7], conc, now)
    if retry ~= 0 and worst == nil then worst = { 0, 'concurrency', retry } end
  end
  if worst then
    out[i] = worst
  else
    local refs = { '0', '0', '0', '0', '0', '0' }
    for j, d in ipairs(dims) do
      if d.spec.alg ~= 'none' then
        local ref = commit(d.spec, costs[j])
        -- A window's ref is its bucket id, a whole number: returned as an
        -- integer reply, not formatted by tostring (a printf of a double per
        -- dimension per reservation would be the script's largest cost in a batch).
        if d.spec.alg == 'window' then refs[j] = ref else refs[j] = tostring(ref) end
      end
    end
    if conc > 0 then sem_commit(KEYS[7], ARGV[base + 3], tonumber(ARGV[base + 4]), now) end
    out[i] = { 1, refs[1], refs[2], refs[3], refs[4], refs[5], refs[6], now }
  end
end
for _, d in ipairs(dims) do
  local s = d.spec
  if s.alg == 'window' then
    flush(s)
    -- A new bucket whose every reservation was refused: its head was written,
    -- and later commits in it will not push the expiry back (they see no new
    -- bucket), so push it now.
    if s.st.renew then redis.call('PEXPIRE', s.key, s.window_ms + 2 * s.p) end
  end
end
return out
