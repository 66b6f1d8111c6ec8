-- commit_file.lua: KEYS upload blob meta ix, the owner's uploads; ARGV grace id owner bytes
-- chunks tail-index tail quota expires blob-id record. The upload's last chunk (tail, possibly
-- empty; reserved already) is written here, and the upload renamed to the file's blob, only once
-- the id and the quota are settled; its reservation becomes the file's bytes. A refused commit
-- writes nothing. Returns {'ok'}, {'exists'}, {'quota', used} or {'lost'} (the upload's bytes and
-- reservation expired before the commit).
local upload, blob, meta, ix, z = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local grace, id, n, up = ARGV[3], ARGV[4], tonumber(ARGV[6]), ARGV[12]
reap(ix, grace)
local old = redis.call('HMGET', meta, 'ix', 'e')
if old[1] then
  if not dead(old[2]) then return {'exists'} end
  -- An expired file, of any owner, is gone for every reader: its id is free.
  unindex(old[1], id)
  fit_files(old[1])
  drop_meta(meta, grace)
end
fit_uploads(z)
fit_uploads(UPLOADS)
local mine = redis.call('HGET', z .. ':n', up)
if not mine then return {'lost'} end
-- The upload's own bytes are reserved already: what the others hold counts beside them.
local used = committed(ix) + reserved(z) - tonumber(mine)
local quota = tonumber(ARGV[10])
if quota > 0 and used + n > quota then return {'quota', used} end
local chunks, tail = tonumber(ARGV[7]), ARGV[9]
local stored = chunks
if tail ~= '' then stored = chunks - 1 end
if redis.call('HLEN', upload) ~= stored then return {'lost'} end
drop_upload(z, up)
drop_upload(UPLOADS, up)
local expires = ARGV[11]
if chunks > 0 then
  if tail ~= '' then redis.call('HSET', upload, ARGV[8], tail) end
  redis.call('RENAME', upload, blob)
  live(blob, expires)
end
redis.call('HSET', meta, 'o', ARGV[5], 'n', n, 'b', ARGV[12], 'e', expires, 'ix', ix, 'r', ARGV[13])
live(meta, expires)
redis.call('ZADD', ix, 0, id)
redis.call('ZADD', ix .. ':exp', score(expires), id)
redis.call('HSET', ix .. ':size', id, n)
redis.call('INCRBY', ix .. ':bytes', n)
fit_files(ix)
return {'ok'}
