-- delete_container_file.lua: KEYS cntr, marker; ARGV owner container-id file-id.
local cntr, marker = KEYS[1], KEYS[2]
local c = redis.call('HMGET', cntr, 'o', 'f')
if not c[1] or c[1] ~= ARGV[3] or dead(c[2]) then return {'notfound'} end
if redis.call('HDEL', cntr .. ':files', ARGV[5]) == 0 then return {'notfound'} end
if redis.call('GET', marker) == ARGV[4] then redis.call('DEL', marker) end
return {'ok'}
