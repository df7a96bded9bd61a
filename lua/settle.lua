-- settle.lua: settles one reservation made by reserve.lua: corrects each window
-- dimension to its real cost (refund or debt, into the reservation's own bucket or
-- log entry) and frees its concurrency slot.
--
-- KEYS[1..6] the window keys, KEYS[7] the concurrency key (as reserve)
-- ARGV[1] permit id (removed from the semaphore; '' = none)
-- ARGV[2] how many ms ago the upstream answered (-1: never sent or answered): the
--   cost moves to the bucket of the answer (see dim_settle_at in lib.lua)
-- ARGV[3 + 7(j-1) ..] for window j: its spec (four, as reserve), ref, reserved,
--   actual
-- Returns the correction actually applied per window (0 when the reservation's
--   bucket already left the window and the answer's too).
-- Complexity: O(1) for window and gcra, O(log n) for log and the semaphore.

local now = now_ms()
local ago = tonumber(ARGV[2]) or -1
local out = { 0, 0, 0, 0, 0, 0 }
for j = 1, 6 do
  local at = 3 + 7 * (j - 1)
  local d = read_dim(KEYS[j], at)
  if d.alg ~= 'none' then
    local reserved, actual = tonumber(ARGV[at + 5]), tonumber(ARGV[at + 6])
    out[j] = dim_settle_at(d, ARGV[at + 4], reserved, actual, ago, now)
  end
end
if ARGV[1] ~= '' then redis.call('ZREM', KEYS[7], ARGV[1]) end
return out
