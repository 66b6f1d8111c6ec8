-- update_container.lua: KEYS cntr; ARGV id owner version forget expires record place-until
-- shared. Returns {'ok', new version, created}, {'conflict', stored version} or {'notfound'}.
local cntr, id = KEYS[1], ARGV[3]
local cur = redis.call('HMGET', cntr, 'o', 'v', 'f', 'c', 'ix')
if not cur[1] or cur[1] ~= ARGV[4] or dead(cur[3]) then return {'notfound'} end
if cur[2] ~= ARGV[5] then return {'conflict', cur[2]} end
local forget, expires = ARGV[6], ARGV[7]
local v = redis.call('HINCRBY', cntr, 'v', 1)
redis.call('HSET', cntr, 'f', forget, 'e', expires, 'r', ARGV[8])
if forget ~= cur[3] then
  live(cntr, forget)
  local files = cntr .. ':files'
  if redis.call('EXISTS', files) == 1 then
    live(files, forget)
    for _, fid in ipairs(redis.call('HKEYS', files)) do
      local m = P .. 'cfile:' .. fid
      if redis.call('GET', m) == id then live(m, forget) end
    end
  end
  local ix = cur[5]
  redis.call('ZADD', ix .. ':forget', score(forget), id)
  fit(ix .. ':forget', {ix, ix .. ':forget'})
end
local ex = P .. 'cntrs:expiring'
if expires ~= '0' then
  redis.call('ZADD', ex, expires, id)
  redis.call('ZADD', ex .. ':forget', score(forget), id)
  fit_expiring()
elseif redis.call('ZREM', ex, id) == 1 then
  redis.call('ZREM', ex .. ':forget', id)
  fit_expiring()
end
place(cur[5], id, ARGV[9], ARGV[10])
return {'ok', v, cur[4]}
