-- charge.lua: adds spending into a bucketed window after the fact: a node that
-- lost Redis admitted requests locally (within its share) and, once Redis answers
-- again, reconciles them here before using Redis again.
--
-- KEYS[1] the window HASH (as reserve.lua)
-- ARGV[1] window_ms, ARGV[2] bucket_ms, ARGV[3] the gateway's clock when it sent
--   this (ms), ARGV[4] skew tolerance ms, then (bucket, cost) pairs, bucketed by
--   the gateway's clock.
-- The buckets are judged on Redis TIME, as lease.lua judges a holder's: a gateway
-- clock further behind than the tolerance has its buckets shifted forward by the
-- rest, rounded up to buckets (they would leave Redis's window early), and a
-- bucket ahead of Redis's current one counts in it (it would be dropped).
-- Returns the total added (buckets that already left the window add nothing:
-- they count nowhere any more).
-- Complexity: O(pairs).

local now = now_ms()
local window_ms, bucket_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local sent, tolerance = tonumber(ARGV[3]), tonumber(ARGV[4])
local shift = math.max(0, math.ceil((now - sent - tolerance) / bucket_ms))
local now_b = math.floor(now / bucket_ms)
local added = 0
for i = 5, #ARGV, 2 do
  local bucket = math.min(tonumber(ARGV[i]) + shift, now_b)
  added = added + win_charge(KEYS[1], window_ms, bucket_ms, bucket, tonumber(ARGV[i + 1]), now)
end
return added
