-- put_container_file.lua: KEYS cntr, marker; ARGV owner container-id file-id record.
local cntr, marker = KEYS[1], KEYS[2]
local c = redis.call('HMGET', cntr, 'o', 'f')
if not c[1] or c[1] ~= ARGV[3] or dead(c[2]) then return {'notfound'} end
local cid, fid = ARGV[4], ARGV[5]
local m = redis.call('GET', marker)
if m and m ~= cid then
  local other = P .. 'cntr:' .. m
  local o = redis.call('HMGET', other, 'o', 'f')
  if o[1] and not dead(o[2]) then return {'exists'} end
  redis.call('HDEL', other .. ':files', fid)
end
local files = cntr .. ':files'
redis.call('HSET', files, fid, ARGV[6])
redis.call('SET', marker, cid)
live(files, c[2])
live(marker, c[2])
return {'ok'}
