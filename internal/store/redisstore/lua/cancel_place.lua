-- cancel_place.lua: KEYS the owner's places, cntr; ARGV id owner.
local c = redis.call('HMGET', KEYS[2], 'o', 'f')
if c[1] == ARGV[4] and not dead(c[2]) then return {'ok'} end
if redis.call('ZREM', KEYS[1], ARGV[3]) == 1 then fit_places(KEYS[1]) end
if redis.call('ZREM', SHARED, ARGV[3]) == 1 then fit_places(SHARED) end
return {'ok'}
