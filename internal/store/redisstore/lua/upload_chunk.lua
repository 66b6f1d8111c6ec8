-- upload_chunk.lua: KEYS upload, the owner's uploads, the owner's file index; ARGV upload-id
-- bytes quota max-in-flight until ttl [chunk-index chunk]. Reserves bytes more for the upload,
-- then stores the chunk when one is given: nothing reaches Redis unreserved. The upload's bytes
-- and its reservation get the same lifetime. The owner's expired files are not dropped first
-- (Begin and Commit do): one still counting can refuse a chunk, never let one too many in.
-- Returns {'ok'}, {'quota', used}, {'full', in flight} or {'lost'} (the reservation ended).
local upload, z, ix, id = KEYS[1], KEYS[2], KEYS[3], ARGV[3]
local add, quota, cap, upto = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
fit_uploads(z)
fit_uploads(UPLOADS)
if not redis.call('ZSCORE', z, id) then return {'lost'} end
if add > 0 then
  local used = committed(ix) + reserved(z)
  if quota > 0 and used + add > quota then return {'quota', used} end
  local all = reserved(UPLOADS)
  if cap > 0 and all + add > cap then return {'full', all} end
end
hold_upload(z, id, add, upto)
hold_upload(UPLOADS, id, add, upto)
if ARGV[9] then redis.call('HSET', upload, ARGV[9], ARGV[10]) end
redis.call('PEXPIRE', upload, ARGV[8])
return {'ok'}
