-- settle.lua: settles one reservation made by reserve.lua: corrects each window
-- dimension to its real cost (refund or debt, into the reservation's own bucket or
-- log entry) and frees its concurrency slot.
--
-- KEYS[1] requests key, KEYS[2] tokens key, KEYS[3] concurrency key (as reserve)
-- ARGV[1] permit id (removed from the semaphore; '' = none)
-- ARGV[2..5]   requests spec (as reserve), ARGV[6] ref, ARGV[7] reserved, ARGV[8] actual
-- ARGV[9..12]  tokens spec, ARGV[13] ref, ARGV[14] reserved, ARGV[15] actual
-- ARGV[16] how many ms ago the upstream answered (-1: never sent or answered): the
--   cost moves to the bucket of the answer (see dim_settle_at in lib.lua)
-- Returns {requests correction, tokens correction} actually applied (0 when the
--   reservation's bucket already left the window and the answer's too).
-- Complexity: O(1) for window and gcra, O(log n) for log and the semaphore.

local now = now_ms()
local ago = tonumber(ARGV[16]) or -1
local out = { 0, 0 }
local specs = { { read_dim(KEYS[1], 2), 6 }, { read_dim(KEYS[2], 9), 13 } }
for i, s in ipairs(specs) do
  local d, at = s[1], s[2]
  if d.alg ~= 'none' then
    local reserved, actual = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    out[i] = dim_settle_at(d, ARGV[at], reserved, actual, ago, now)
  end
end
if ARGV[1] ~= '' then redis.call('ZREM', KEYS[3], ARGV[1]) end
return out
