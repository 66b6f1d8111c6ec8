-- claim.lua: KEYS claim; ARGV holder until-ms ttl-ms. Returns {'ok'} or {'held'}.
local v = redis.call('GET', KEYS[1])
if v then
  local sep = string.find(v, ':', 1, true)
  if string.sub(v, sep + 1) ~= ARGV[3] and NOW < tonumber(string.sub(v, 1, sep - 1)) then
    return {'held'}
  end
end
redis.call('SET', KEYS[1], ARGV[4] .. ':' .. ARGV[3], 'PX', ARGV[5])
return {'ok'}
