-- reserve.lua: admits one request on every dimension of one limit scope, or on
-- none (all checks first, then all commits, in one atomic call).
--
-- KEYS[1] requests window key, KEYS[2] tokens window key, KEYS[3] concurrency
--         semaphore key (same {scope} hash tag)
-- ARGV[1] token cost (prompt + completion estimate)
-- ARGV[2] permit id (the semaphore member), ARGV[3] slot ttl in ms
-- ARGV[4..7]   requests: alg ('window' | 'gcra' | 'log' | 'none'), cap, window_ms,
--              bucket_ms (window) or burst (gcra)
-- ARGV[8..11]  tokens: the same four
-- ARGV[12]     concurrency cap (0: none)
-- Returns {1, requests ref, tokens ref, now_ms} (refs settle the reservation:
--   a bucket id, a log member or 0) or {0, dimension, retry_after_ms} with
--   dimension 'requests' | 'tokens' | 'concurrency' and retry -1 = never.
-- Complexity: O(1) for window and gcra, O(entries in the window) for log,
--   O(log n) for the semaphore.

local now = now_ms()
local cost = tonumber(ARGV[1])
local dims = {
  { name = 'requests', spec = read_dim(KEYS[1], 4), cost = 1 },
  { name = 'tokens', spec = read_dim(KEYS[2], 8), cost = cost },
}
local conc = tonumber(ARGV[12])
local worst = nil
for _, d in ipairs(dims) do
  if d.spec.alg ~= 'none' then
    local retry = dim_check(d.spec, d.cost, now)
    if retry ~= 0 and (worst == nil or retry == -1 or (worst[3] ~= -1 and retry > worst[3])) then
      worst = { 0, d.name, retry }
    end
  end
end
if conc > 0 then
  local retry = sem_check(KEYS[3], conc, now)
  if retry ~= 0 and worst == nil then worst = { 0, 'concurrency', retry } end
end
if worst then return worst end
local refs = { '0', '0' }
for i, d in ipairs(dims) do
  if d.spec.alg ~= 'none' then refs[i] = tostring(dim_commit(d.spec, d.cost, now)) end
end
if conc > 0 then sem_commit(KEYS[3], ARGV[2], tonumber(ARGV[3]), now) end
return { 1, refs[1], refs[2], now }
