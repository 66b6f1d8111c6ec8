-- mint.lua: KEYS idclock; ARGV ttl. Returns the millisecond of a new id: after the last one.
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
local ms = math.max(NOW, last + 1)
redis.call('SET', KEYS[1], string.format('%d', ms), 'PX', ARGV[3])
return ms
