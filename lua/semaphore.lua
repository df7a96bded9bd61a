-- semaphore.lua: one concurrency semaphore with a ttl per slot, so a crashed
-- holder's slots come back by themselves (ghost slots expire).
--
-- KEYS[1] the semaphore ZSET (member = permit id, score = expiry in ms)
-- ARGV[1] op: 'acquire' | 'heartbeat' | 'restore' | 'release'
-- ARGV[2] permit id, ARGV[3] cap (acquire), ARGV[4] ttl in ms (acquire, heartbeat)
-- Returns acquire: 0 when taken (or already held: refreshed), else retry_after_ms
--   (the earliest expiry); heartbeat: 1 if the slot was still held and is
--   extended, 0 if it had expired (the holder must acquire again); restore: 1,
--   the slot held again whatever the cap (its stream runs: Redis lost it, by a
--   stall past its ttl or a restart, and not counting it would let others take
--   it); release: 1 if it was held.
-- Atomic: expired slots are removed, counted and the new one added in one call
--   (no ZCARD-then-ZADD race across calls). Complexity O(log n).

local now = now_ms()
local key, op, id = KEYS[1], ARGV[1], ARGV[2]
if op == 'acquire' then
  local ttl = tonumber(ARGV[4])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if redis.call('ZSCORE', key, id) then
    sem_commit(key, id, ttl, now)
    return 0
  end
  local retry = sem_check(key, tonumber(ARGV[3]), now)
  if retry ~= 0 then return retry end
  sem_commit(key, id, ttl, now)
  return 0
elseif op == 'heartbeat' then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if not redis.call('ZSCORE', key, id) then return 0 end
  sem_commit(key, id, tonumber(ARGV[4]), now)
  return 1
elseif op == 'restore' then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  sem_commit(key, id, tonumber(ARGV[4]), now)
  return 1
elseif op == 'release' then
  return redis.call('ZREM', key, id)
end
return redis.error_reply('unknown op ' .. tostring(op))
