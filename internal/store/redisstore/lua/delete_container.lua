-- delete_container.lua: KEYS cntr; ARGV id owner.
local cur = redis.call('HMGET', KEYS[1], 'o', 'f')
if not cur[1] or cur[1] ~= ARGV[4] or dead(cur[2]) then return {'notfound'} end
drop_container(KEYS[1], ARGV[3])
return {'ok'}
