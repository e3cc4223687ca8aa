"""The shared ledger's Lua scripts. Redis runs each one atomically: nothing another
replica does can interleave with a check and the change it allows."""

from __future__ import annotations

from portcullis.engine.governance import WINDOW_MS

# A calendar counter's high-water mark (``<key>:peak``) rises with it in the same script
# and expires with it, so a budget tier reached in a period holds until the period ends.
RAISE_PEAK = """
local function raise_peak(key, value)
  local peak = redis.call('GET', key .. ':peak')
  if peak and tonumber(peak) >= value then return end
  local ttl = redis.call('PTTL', key)
  if ttl > 0 then redis.call('SET', key .. ':peak', value, 'PX', ttl) else redis.call('SET', key .. ':peak', value) end
end
"""

# KEYS: counters, then the reservation's marker (set when it is admitted, so a command
# the client re-sends after a lost reply — redis-py retries connection errors once — is
# answered "ok" without counting the reservation twice). ARGV per counter (5 each): amount, block (-1: none), hard (1/0), warn (-1: none),
# window (1/0); then the time in ms and the reservation id. A window counter's key holds its
# total, ``<key>:log`` (a sorted set: reservation id by time) and ``<key>:amounts`` its entries.
# Returns {"missing", i...} | {"blocked", i, ms until it fits (-1: not a window)} | {"ok", warned i...};
# indices are 1-based.
RESERVE = RAISE_PEAK + """
local n = #KEYS - 1
local marker = KEYS[#KEYS]
if redis.call('EXISTS', marker) == 1 then return {'ok'} end
local now, id = tonumber(ARGV[5 * n + 1]), ARGV[5 * n + 2]
local horizon = now - WINDOW_MS
local values = {}
local missing = {}
for i = 1, n do
  local key = KEYS[i]
  local value = redis.call('GET', key)
  if value then values[i] = tonumber(value) else missing[#missing + 1] = i end
end
if #missing > 0 then return {'missing', unpack(missing)} end
for i = 1, n do
  local key = KEYS[i]
  if ARGV[5 * i] == '1' then
    local gone = redis.call('ZRANGEBYSCORE', key .. ':log', '-inf', horizon)
    if #gone > 0 then
      local freed = 0
      for _, member in ipairs(gone) do
        freed = freed + tonumber(redis.call('HGET', key .. ':amounts', member) or '0')
        redis.call('HDEL', key .. ':amounts', member)
      end
      redis.call('ZREMRANGEBYSCORE', key .. ':log', '-inf', horizon)
      values[i] = values[i] - freed
      redis.call('SET', key, values[i], 'KEEPTTL')
    end
  end
end
for i = 1, n do
  local key = KEYS[i]
  local amount, block, hard = tonumber(ARGV[5 * i - 4]), tonumber(ARGV[5 * i - 3]), ARGV[5 * i - 2] == '1'
  if block >= 0 and ((hard and values[i] + amount > block) or ((not hard) and values[i] >= block)) then
    local wait = -1
    if ARGV[5 * i] == '1' then
      local needed = values[i] - block + 1
      if hard then needed = values[i] + amount - block end
      local freed, last = 0, horizon
      local oldest = redis.call('ZRANGE', key .. ':log', 0, 999, 'WITHSCORES')
      for j = 1, #oldest, 2 do
        if freed >= needed then break end
        freed = freed + tonumber(redis.call('HGET', key .. ':amounts', oldest[j]) or '0')
        last = tonumber(oldest[j + 1])
      end
      wait = math.max(0, last + WINDOW_MS - now)
    end
    return {'blocked', i, wait}
  end
end
local warned = {'ok'}
for i = 1, n do
  local key = KEYS[i]
  local amount, warn = tonumber(ARGV[5 * i - 4]), tonumber(ARGV[5 * i - 1])
  local after = redis.call('INCRBY', key, amount)
  if ARGV[5 * i] ~= '1' then raise_peak(key, after) end
  if ARGV[5 * i] == '1' then
    redis.call('ZADD', key .. ':log', now, id)
    redis.call('HINCRBY', key .. ':amounts', id, amount)
    for _, part in ipairs({key, key .. ':log', key .. ':amounts'}) do redis.call('PEXPIRE', part, KEEP_MS) end
  end
  if warn >= 0 and values[i] + amount > warn then warned[#warned + 1] = i end
end
redis.call('SET', marker, '1', 'PX', KEEP_MS)
return warned
""".replace("WINDOW_MS", str(WINDOW_MS)).replace("KEEP_MS", str(3 * WINDOW_MS))

# KEYS[1]: a window's total. ARGV: how long to keep it (ms), then (id, at ms, amount) per entry.
# Rebuilds a window from the ledger's rows unless another replica already did.
LOAD_WINDOW = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[1] .. ':log', KEYS[1] .. ':amounts')
local total = 0
for j = 2, #ARGV, 3 do
  redis.call('ZADD', KEYS[1] .. ':log', ARGV[j + 1], ARGV[j])
  redis.call('HSET', KEYS[1] .. ':amounts', ARGV[j], ARGV[j + 2])
  total = total + tonumber(ARGV[j + 2])
end
redis.call('SET', KEYS[1], total, 'PX', ARGV[1])
redis.call('PEXPIRE', KEYS[1] .. ':log', ARGV[1])
redis.call('PEXPIRE', KEYS[1] .. ':amounts', ARGV[1])
return 1
"""

# KEYS[1]: the settlement marker, then counters. ARGV: marker ttl, reservation id, then per
# counter a delta and window (1/0). Applies the deltas once per marker — to a window only
# while the reservation's entry is still in it; returns each counter's new value (-1: not
# moved) or {} on replay. A calendar counter's peak rises with it.
SETTLE = RAISE_PEAK + """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return {} end
local id = ARGV[2]
local after = {}
for i = 2, #KEYS do
  local key, delta, window = KEYS[i], ARGV[2 * i - 1], ARGV[2 * i] == '1'
  if redis.call('EXISTS', key) == 1 and ((not window) or redis.call('ZSCORE', key .. ':log', id)) then
    if window then redis.call('HINCRBY', key .. ':amounts', id, delta) end
    after[i - 1] = redis.call('INCRBY', key, delta)
    if (not window) and tonumber(delta) > 0 then raise_peak(key, after[i - 1]) end  -- a fall leaves the peak
  else
    after[i - 1] = -1
  end
end
return after
"""
