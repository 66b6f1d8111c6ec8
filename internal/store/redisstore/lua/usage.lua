-- usage.lua: KEYS owner's file index; ARGV grace. Returns {'ok', files, bytes} after dropping
-- the owner's expired files.
local ix = KEYS[1]
reap(ix, ARGV[3])
return {'ok', redis.call('HLEN', ix .. ':size'), redis.call('GET', ix .. ':bytes') or '0'}
