-- expiring_containers.lua: ARGV before limit. Returns {'ok', then id o v c f r per container},
-- the earliest ExpiresAt first; members whose container is gone are removed on the way.
local ex = P .. 'cntrs:expiring'
local before, limit = ARGV[3], tonumber(ARGV[4])
local out, stale, found, off, full = {'ok'}, {}, 0, 0, false
while not full do
  local ids = redis.call('ZRANGEBYSCORE', ex, '-inf', before, 'LIMIT', off, 100)
  if #ids == 0 then break end
  off = off + #ids
  for _, id in ipairs(ids) do
    local cntr = P .. 'cntr:' .. id
    local h = redis.call('HMGET', cntr, 'o', 'v', 'c', 'f', 'r')
    if h[1] and not dead(h[4]) then
      if limit > 0 and found == limit then full = true break end
      found = found + 1
      out[#out + 1] = id
      for i = 1, 5 do out[#out + 1] = h[i] end
    else
      stale[#stale + 1] = id
    end
  end
end
for _, id in ipairs(stale) do
  local cntr = P .. 'cntr:' .. id
  if redis.call('EXISTS', cntr) == 1 then
    drop_container(cntr, id)
  else
    redis.call('ZREM', ex, id)
    redis.call('ZREM', ex .. ':forget', id)
  end
end
if #stale > 0 then fit_expiring() end
return out
