-- reap_containers.lua: KEYS owner's container index. Drops the owner's forgotten containers and
-- the index entries of containers that are gone.
local ix = KEYS[1]
local life = ix .. ':forget'
local ids = redis.call('ZRANGEBYSCORE', life, '-inf', NOW, 'LIMIT', 0, 1000)
for _, id in ipairs(ids) do
  local cntr = P .. 'cntr:' .. id
  local h = redis.call('HMGET', cntr, 'ix', 'f')
  if h[1] == ix and dead(h[2]) then
    drop_container(cntr, id)
  elseif h[1] == ix then
    redis.call('ZADD', life, score(h[2]), id)
  else
    redis.call('ZREM', ix, id)
    redis.call('ZREM', life, id)
  end
end
if #ids > 0 then fit(life, {ix, life}) end
return {'ok'}
