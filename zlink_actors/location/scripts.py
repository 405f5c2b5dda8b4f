"""The Lua scripts of `RedisLocationStore` (private: the key layout may change).

Key layout under the namespace `N = <len>:<key_prefix>:zla1:` (`<len>` the prefix's
UTF-8 length in decimal, so no prefix can forge another's namespace):

- `N k:<key>`: a hash per key: `v` the value, `r` the version, `e` the expiry in
  microseconds on the Redis clock (absent = none). A key with a TTL also gets a Redis
  `PEXPIREAT` a millisecond after `e`, only to reclaim memory: reads, conditions and
  scans decide expiry from `e` and `TIME`.
- `N i`: a sorted set of every key (all scores 0, ordered by bytes), updated by the same
  script as the hashes: the scan index, walked by `ZRANGE BYLEX`.
- `N e`: the scan epoch, a random token set on the first scan; a server that lost its
  data (a restart without persistence) loses it too, so old cursors are expired.

Times are microseconds (`TIME` seconds * 10^6 + microseconds), exact in a Lua double.
"""

from __future__ import annotations

import hashlib
from typing import Final

__all__ = ["READ", "SCAN", "WRITE", "sha1"]

#: KEYS[1] the data hash. Returns {sec, usec} (missing) or {sec, usec, value, version,
#: expiry-or-empty}.
READ: Final = b"""
local t = redis.call('TIME')
local cur = redis.call('HMGET', KEYS[1], 'v', 'r', 'e')
if not cur[2] then return {t[1], t[2]} end
if cur[3] and tonumber(cur[3]) <= tonumber(t[1]) * 1000000 + tonumber(t[2]) then
  return {t[1], t[2]}
end
return {t[1], t[2], cur[1], cur[2], cur[3] or ''}
"""

#: KEYS[1] the index, then the data hashes of the conditions, then of the mutations.
#: ARGV: ncond, the length of the data-key prefix, then per condition kind ('m' | 'v')
#: and version, then per mutation 'd', or 'p', value, version, ttl-microseconds-or-empty.
#: Checks every condition and every mutation's arguments (a ttl in 1..10^15 us) first,
#: then applies every mutation; a bad argument is an error reply before any write.
#: Returns {1 | 0, sec, usec}.
WRITE: Final = b"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nc = tonumber(ARGV[1])
local plen = tonumber(ARGV[2])
local a = 3
for i = 1, nc do
  local cur = redis.call('HMGET', KEYS[1 + i], 'r', 'e')
  local ver = cur[1]
  if ver and cur[2] and tonumber(cur[2]) <= now then ver = false end
  if ARGV[a] == 'm' then
    if ver then return {0, t[1], t[2]} end
  elseif ver ~= ARGV[a + 1] then
    return {0, t[1], t[2]}
  end
  a = a + 2
end
-- Check and compute every argument before the first write, so a bad one changes nothing.
local exps = {}
local b = a
for i = nc + 2, #KEYS do
  if ARGV[b] == 'd' then
    b = b + 1
  elseif ARGV[b] == 'p' then
    local ttl = ARGV[b + 3]
    if ttl ~= '' then
      local us = tonumber(ttl)
      if not us or us < 1 or us > 1e15 then
        return redis.error_reply('ERR zla1 bad ttl')
      end
      exps[i] = now + us
    end
    b = b + 4
  else
    return redis.error_reply('ERR zla1 bad mutation')
  end
end
if b ~= #ARGV + 1 then return redis.error_reply('ERR zla1 bad arguments') end
for i = nc + 2, #KEYS do
  local k = KEYS[i]
  local member = string.sub(k, plen + 1)
  if ARGV[a] == 'd' then
    redis.call('DEL', k)
    redis.call('ZREM', KEYS[1], member)
    a = a + 1
  else
    redis.call('DEL', k)
    local exp = exps[i]
    if not exp then
      redis.call('HSET', k, 'v', ARGV[a + 1], 'r', ARGV[a + 2])
    else
      redis.call('HSET', k, 'v', ARGV[a + 1], 'r', ARGV[a + 2], 'e', string.format('%.0f', exp))
      redis.call('PEXPIREAT', k, math.floor(exp / 1000) + 1)
    end
    redis.call('ZADD', KEYS[1], 0, member)
    a = a + 4
  end
end
return {1, t[1], t[2]}
"""

#: KEYS[1] the index, KEYS[2] the epoch. ARGV: data-key prefix, low and high ZRANGE BYLEX
#: bounds, limit, the cursor's epoch (or empty), a fresh epoch, the page's byte budget.
#: Returns {sec, usec, epoch, more (1 | 0 | -1 = expired), key, value, version, expiry...}.
SCAN: Final = b"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local epoch = redis.call('GET', KEYS[2])
if not epoch then
  epoch = ARGV[6]
  redis.call('SET', KEYS[2], epoch)
end
if ARGV[5] ~= '' and ARGV[5] ~= epoch then return {t[1], t[2], epoch, -1} end
local limit = tonumber(ARGV[4])
local budget = tonumber(ARGV[7])
local out = {t[1], t[2], epoch, 0}
local count, size, full, last = 0, 0, false, nil
local lo = ARGV[2]
while true do
  local members = redis.call('ZRANGE', KEYS[1], lo, ARGV[3], 'BYLEX', 'LIMIT', 0, limit)
  for _, m in ipairs(members) do
    local k = ARGV[1] .. m
    local cur = redis.call('HMGET', k, 'v', 'r', 'e')
    if not cur[2] or (cur[3] and tonumber(cur[3]) <= now) then
      redis.call('ZREM', KEYS[1], m)
      redis.call('DEL', k)
    else
      if count > 0 and size + #cur[1] > budget then
        full = true
        break
      end
      out[#out + 1] = m
      out[#out + 1] = cur[1]
      out[#out + 1] = cur[2]
      out[#out + 1] = cur[3] or ''
      count = count + 1
      size = size + #cur[1]
      last = m
      if count == limit then
        full = true
        break
      end
    end
    lo = '(' .. m
  end
  if full or #members < limit then break end
end
if full then
  local nxt = redis.call('ZRANGE', KEYS[1], '(' .. last, ARGV[3], 'BYLEX', 'LIMIT', 0, 1)
  if #nxt > 0 then out[4] = 1 end
end
return out
"""


def sha1(script: bytes) -> str:
    """The `EVALSHA` digest of a script."""
    return hashlib.sha1(script).hexdigest()
