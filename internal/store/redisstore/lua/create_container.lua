-- create_container.lua: KEYS cntr; ARGV id owner ix created forget expires record place-until
-- shared.
local cntr, id = KEYS[1], ARGV[3]
if redis.call('EXISTS', cntr) == 1 then
  if not dead(redis.call('HGET', cntr, 'f')) then return {'exists'} end
  drop_container(cntr, id)
end
local ix, forget, expires = ARGV[5], ARGV[7], ARGV[8]
redis.call('HSET', cntr, 'o', ARGV[4], 'v', 1, 'c', ARGV[6], 'f', forget, 'e', expires, 'ix', ix, 'r', ARGV[9])
live(cntr, forget)
redis.call('ZADD', ix, 0, id)
redis.call('ZADD', ix .. ':forget', score(forget), id)
fit(ix .. ':forget', {ix, ix .. ':forget'})
if expires ~= '0' then
  local ex = P .. 'cntrs:expiring'
  redis.call('ZADD', ex, expires, id)
  redis.call('ZADD', ex .. ':forget', score(forget), id)
  fit_expiring()
end
place(ix, id, ARGV[10], ARGV[11])
return {'ok'}
