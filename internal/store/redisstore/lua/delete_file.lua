-- delete_file.lua: KEYS meta; ARGV grace owner id. Returns {'ok', record} or {'notfound'}.
local m = redis.call('HMGET', KEYS[1], 'o', 'e', 'ix', 'r')
if not m[1] or m[1] ~= ARGV[4] or dead(m[2]) then return {'notfound'} end
unindex(m[3], ARGV[5])
fit_files(m[3])
drop_meta(KEYS[1], ARGV[3])
return {'ok', m[4]}
