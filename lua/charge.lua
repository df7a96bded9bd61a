-- charge.lua: adds spending into a bucketed window after the fact: a node that
-- lost Redis admitted requests locally (within its share) and, once Redis answers
-- again, reconciles them here before using Redis again.
--
-- KEYS[1] the window HASH (as reserve.lua)
-- ARGV[1] window_ms, ARGV[2] bucket_ms, then (bucket, cost) pairs
-- Returns the total added (buckets that already left the window add nothing).
-- Complexity: O(pairs).

local now = now_ms()
local window_ms, bucket_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local added = 0
for i = 3, #ARGV, 2 do
  added = added + win_charge(KEYS[1], window_ms, bucket_ms, tonumber(ARGV[i]), tonumber(ARGV[i + 1]), now)
end
return added
