-- begin_upload.lua: KEYS the owner's uploads, the owner's file index; ARGV grace upload-id
-- max-uploads quota max-in-flight until. Reserves nothing yet but the upload's place among the
-- owner's uploads in flight, until until. Returns {'ok'}, {'busy', uploads} (max-uploads
-- reached), {'quota', used} (the owner's files and uploads hold the quota) or {'full', in flight}.
local z, ix, id = KEYS[1], KEYS[2], ARGV[4]
local most, quota, cap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
reap(ix, ARGV[3])
fit_uploads(z)
fit_uploads(UPLOADS)
local n = redis.call('ZCARD', z)
if most > 0 and n >= most then return {'busy', n} end
local used = committed(ix) + reserved(z)
if quota > 0 and used >= quota then return {'quota', used} end
local all = reserved(UPLOADS)
if cap > 0 and all >= cap then return {'full', all} end
hold_upload(z, id, 0, ARGV[8])
hold_upload(UPLOADS, id, 0, ARGV[8])
return {'ok'}
