-- places.lua: KEYS the owner's places. Returns {'ok', the owner's places, the shared places}.
fit_places(KEYS[1])
fit_places(SHARED)
return {'ok', redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', SHARED)}
