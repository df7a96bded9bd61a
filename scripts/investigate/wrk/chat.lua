-- wrk script for scripts/investigate/bench-floor.sh (GENERATOR=wrk): the request `tollgate load`
-- sends by default (chat, a 16-token prompt in 16 variants, max_tokens 64, key
-- sk-bench), and one summary line the script parses. No response() hook: it
-- would make wrk parse every body in Lua; non-2xx answers are counted by wrk.
local words = {"apple", "river", "stone", "cloud", "green", "light", "water", "house",
  "music", "paper", "table", "horse", "bread", "glass", "chair", "plant"}
local bodies = {}
for i, w in ipairs(words) do
  bodies[i] = '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"'
    .. w .. string.rep(" hello", 15) .. '"}],"max_tokens":64}'
end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
local n = 0
request = function()
  n = n + 1
  return wrk.format(nil, nil, nil, bodies[n % #bodies + 1])
end
done = function(summary, latency, requests)
  local e = summary.errors
  -- requests, seconds, p50 ms, p99 ms, failed (socket errors and non-2xx)
  io.write(string.format("WRK %d %.6f %.3f %.3f %d\n", summary.requests,
    summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    e.connect + e.read + e.write + e.timeout + e.status))
end
