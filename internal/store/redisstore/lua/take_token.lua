-- take_token.lua: KEYS bucket; ARGV per-minute burst. The bucket (t tokens at a ms) is timed by
-- Redis's clock, not the replicas': every replica takes from it, and one clock makes its refill
-- the same whichever replica asks. Returns {'ok'} or {'wait', ms until a token}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local rate, burst = tonumber(ARGV[3]) / 60000, tonumber(ARGV[4])
local b = redis.call('HMGET', KEYS[1], 't', 'a')
local tokens = burst
if b[1] then
  tokens = math.min(burst, tonumber(b[1]) + math.max(0, now - tonumber(b[2])) * rate)
end
if tokens < 1 then
  return {'wait', math.ceil((1 - tokens) / rate)}
end
tokens = tokens - 1
redis.call('HSET', KEYS[1], 't', string.format('%.17g', tokens), 'a', string.format('%.17g', now))
redis.call('PEXPIRE', KEYS[1], math.max(1, math.ceil((burst - tokens) / rate)))
return {'ok'}
