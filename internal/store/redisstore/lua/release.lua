-- release.lua: KEYS claim; ARGV holder.
local v = redis.call('GET', KEYS[1])
if v then
  local sep = string.find(v, ':', 1, true)
  if string.sub(v, sep + 1) == ARGV[3] then redis.call('DEL', KEYS[1]) end
end
return {'ok'}
