-- reserve_place.lua: KEYS the owner's places; ARGV id max-per-owner max-shared shared until.
-- Returns {status, the owner's places, the shared places (0 unless shared)}: 'ok' (reserved or
-- already held), 'owner' or 'shared' (refused by that bound).
local z, id = KEYS[1], ARGV[3]
local mo, ms, shared, untl = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6] == '1', ARGV[7]
fit_places(z)
local n, m = redis.call('ZCARD', z), 0
if shared then
  fit_places(SHARED)
  m = redis.call('ZCARD', SHARED)
end
if redis.call('ZSCORE', z, id) then
  redis.call('ZADD', z, 'GT', untl, id)
  fit_places(z)
  if redis.call('ZSCORE', SHARED, id) then
    redis.call('ZADD', SHARED, 'GT', untl, id)
    fit_places(SHARED)
  end
  return {'ok', n, m}
end
if mo > 0 and n >= mo then return {'owner', n, m} end
if shared and ms > 0 and m >= ms then return {'shared', n, m} end
redis.call('ZADD', z, untl, id)
fit_places(z)
if shared then
  redis.call('ZADD', SHARED, untl, id)
  fit_places(SHARED)
  m = m + 1
end
return {'ok', n + 1, m}
