package redisstore

import "github.com/redis/go-redis/v9"

// The scripts. Each is the prelude followed by its body, and runs atomically in Redis. Every
// script takes ARGV[1] = the key prefix and ARGV[2] = the store's clock in milliseconds; its own
// arguments follow. Each returns a table whose first element is a status ("ok", "exists",
// "notfound", ...), never an error reply, so that an error reply always means Redis failed.
//
// Keys the script derives from records (a container's files and markers, another owner's index
// on a takeover) are not declared in KEYS: the store runs on one Redis, not a cluster (Open checks).
const prelude = `
local P = ARGV[1]
local NOW = tonumber(ARGV[2])

-- dead reports whether an expiry (ms; '0', nil or false: none) has passed.
local function dead(at)
  return at and at ~= '0' and tonumber(at) <= NOW
end

-- live gives key the lifetime of an object expiring at at (ms; '0': never).
local function live(key, at)
  if at == '0' then
    redis.call('PERSIST', key)
  else
    redis.call('PEXPIRE', key, math.max(1, tonumber(at) - NOW))
  end
end

-- score is an expiry as a zset score: never is +inf.
local function score(at)
  if at == '0' then return '+inf' end
  return at
end

-- fit gives the keys of one index the lifetime of its longest-lived member, which the zset life
-- (id -> expiry) names. An index with no member left is deleted whole.
local function fit(life, keys)
  local top = redis.call('ZRANGE', life, -1, -1, 'WITHSCORES')
  for _, k in ipairs(keys) do
    if #top == 0 then
      redis.call('DEL', k)
    elseif top[2] == 'inf' then
      redis.call('PERSIST', k)
    else
      redis.call('PEXPIRE', k, math.max(1, tonumber(top[2]) - NOW))
    end
  end
end

local function fit_expiring()
  local ex = P .. 'cntrs:expiring'
  fit(ex .. ':forget', {ex, ex .. ':forget'})
end

-- The places (see store.Quotas): zsets of container ids scored by until when each holds its place.
local SHARED = P .. 'places:shared'

-- places_of is the places zset of the owner whose container index is ix (owner:<o>:cntrs).
local function places_of(ix)
  return string.sub(ix, 1, -6) .. 'places'
end

-- fit_places drops the places of z that have run out and gives z the lifetime of its last one.
local function fit_places(z)
  redis.call('ZREMRANGEBYSCORE', z, '-inf', NOW)
  local top = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  if #top == 0 then
    redis.call('DEL', z)
  else
    redis.call('PEXPIRE', z, math.max(1, tonumber(top[2]) - NOW))
  end
end

-- place moves container id's place to upto (ms; '0' or passed: it holds none) among the places
-- of its owner (whose container index is ix) and, when shared is '1', the shared places.
local function place(ix, id, upto, shared)
  local on = upto ~= '0' and not dead(upto)
  local z = places_of(ix)
  if on then redis.call('ZADD', z, upto, id) else redis.call('ZREM', z, id) end
  fit_places(z)
  if on and shared == '1' then
    redis.call('ZADD', SHARED, upto, id)
    fit_places(SHARED)
  elseif redis.call('ZREM', SHARED, id) == 1 then
    fit_places(SHARED)
  end
end

-- The uploads in flight (store.Files): a zset of upload ids scored by when each one's reservation
-- ends (ms), and beside it (z .. ':n') a hash of the bytes each has reserved; one pair per owner
-- (owner:<o>:uploads) and one for every owner's (uploads). A reservation that is not renewed ends
-- with the upload's bytes (the same TTL, set by the same script): a process that died mid-upload
-- holds nothing after it.
local UPLOADS = P .. 'uploads'

-- fit_uploads drops the reservations of z that have ended and gives z the lifetime of its last one.
local function fit_uploads(z)
  local n = z .. ':n'
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', z, '-inf', NOW)) do redis.call('HDEL', n, id) end
  redis.call('ZREMRANGEBYSCORE', z, '-inf', NOW)
  local top = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  if #top == 0 then
    redis.call('DEL', z, n)
  else
    local ms = math.max(1, tonumber(top[2]) - NOW)
    redis.call('PEXPIRE', z, ms)
    redis.call('PEXPIRE', n, ms)
  end
end

-- reserved is what the uploads of z have reserved (fit_uploads first).
local function reserved(z)
  local sum = 0
  for _, v in ipairs(redis.call('HVALS', z .. ':n')) do sum = sum + tonumber(v) end
  return sum
end

-- hold_upload reserves add more bytes for upload id in z, and renews its reservation until upto.
local function hold_upload(z, id, add, upto)
  redis.call('ZADD', z, upto, id)
  redis.call('HINCRBY', z .. ':n', id, add)
  fit_uploads(z)
end

local function drop_upload(z, id)
  redis.call('ZREM', z, id)
  redis.call('HDEL', z .. ':n', id)
  fit_uploads(z)
end

-- committed is what the files of the owner whose file index is ix take.
local function committed(ix)
  return tonumber(redis.call('GET', ix .. ':bytes') or '0')
end

-- drop_container removes container id (its key cntr) with its files, their markers and its
-- index entries.
local function drop_container(cntr, id)
  local ix = redis.call('HGET', cntr, 'ix')
  local files = cntr .. ':files'
  for _, fid in ipairs(redis.call('HKEYS', files)) do
    local m = P .. 'cfile:' .. fid
    if redis.call('GET', m) == id then redis.call('DEL', m) end
  end
  redis.call('DEL', files, cntr)
  if ix then
    place(ix, id, '0', '0')
    redis.call('ZREM', ix, id)
    redis.call('ZREM', ix .. ':forget', id)
    fit(ix .. ':forget', {ix, ix .. ':forget'})
  end
  local ex = P .. 'cntrs:expiring'
  if redis.call('ZREM', ex, id) == 1 then
    redis.call('ZREM', ex .. ':forget', id)
    fit_expiring()
  end
end

-- unindex takes file id out of its owner's index ix; its size leaves the owner's bytes.
local function unindex(ix, id)
  local size = ix .. ':size'
  local n = redis.call('HGET', size, id)
  if n then
    redis.call('HDEL', size, id)
    redis.call('DECRBY', ix .. ':bytes', n)
  end
  redis.call('ZREM', ix, id)
  redis.call('ZREM', ix .. ':exp', id)
end

local function fit_files(ix)
  fit(ix .. ':exp', {ix, ix .. ':exp', ix .. ':size', ix .. ':bytes'})
end

-- drop_meta deletes a file's metadata; its bytes stay grace ms at most, for readers in flight.
local function drop_meta(meta, grace)
  local b = redis.call('HGET', meta, 'b')
  if b and b ~= '' then redis.call('PEXPIRE', P .. 'blob:' .. b, grace, 'LT') end
  redis.call('UNLINK', meta)
end

-- reap drops the expired files of the owner whose index is ix, 1000 at most per call.
local function reap(ix, grace)
  local ids = redis.call('ZRANGEBYSCORE', ix .. ':exp', '-inf', NOW, 'LIMIT', 0, 1000)
  for _, id in ipairs(ids) do
    unindex(ix, id)
    local meta = P .. 'file:' .. id
    if redis.call('HGET', meta, 'ix') == ix then drop_meta(meta, grace) end
  end
  if #ids > 0 then fit_files(ix) end
end
`

func script(body string) *redis.Script { return redis.NewScript(prelude + body) }

// scriptMint: KEYS idclock; ARGV ttl. Returns the millisecond of a new id: after the last one.
var scriptMint = script(`
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
local ms = math.max(NOW, last + 1)
redis.call('SET', KEYS[1], string.format('%d', ms), 'PX', ARGV[3])
return ms
`)

// scriptCreateContainer: KEYS cntr; ARGV id owner ix created forget expires record place-until
// shared.
var scriptCreateContainer = script(`
local cntr, id = KEYS[1], ARGV[3]
if redis.call('EXISTS', cntr) == 1 then
  if not dead(redis.call('HGET', cntr, 'f')) then return {'exists'} end
  drop_container(cntr, id)
end
local ix, forget, expires = ARGV[5], ARGV[7], ARGV[8]
redis.call('HSET', cntr, 'o', ARGV[4], 'v', 1, 'c', ARGV[6], 'f', forget, 'e', expires, 'ix', ix, 'r', ARGV[9])
live(cntr, forget)
redis.call('ZADD', ix, 0, id)
redis.call('ZADD', ix .. ':forget', score(forget), id)
fit(ix .. ':forget', {ix, ix .. ':forget'})
if expires ~= '0' then
  local ex = P .. 'cntrs:expiring'
  redis.call('ZADD', ex, expires, id)
  redis.call('ZADD', ex .. ':forget', score(forget), id)
  fit_expiring()
end
place(ix, id, ARGV[10], ARGV[11])
return {'ok'}
`)

// scriptUpdateContainer: KEYS cntr; ARGV id owner version forget expires record place-until
// shared. Returns
// {'ok', new version, created}, {'conflict', stored version} or {'notfound'}.
var scriptUpdateContainer = script(`
local cntr, id = KEYS[1], ARGV[3]
local cur = redis.call('HMGET', cntr, 'o', 'v', 'f', 'c', 'ix')
if not cur[1] or cur[1] ~= ARGV[4] or dead(cur[3]) then return {'notfound'} end
if cur[2] ~= ARGV[5] then return {'conflict', cur[2]} end
local forget, expires = ARGV[6], ARGV[7]
local v = redis.call('HINCRBY', cntr, 'v', 1)
redis.call('HSET', cntr, 'f', forget, 'e', expires, 'r', ARGV[8])
if forget ~= cur[3] then
  live(cntr, forget)
  local files = cntr .. ':files'
  if redis.call('EXISTS', files) == 1 then
    live(files, forget)
    for _, fid in ipairs(redis.call('HKEYS', files)) do
      local m = P .. 'cfile:' .. fid
      if redis.call('GET', m) == id then live(m, forget) end
    end
  end
  local ix = cur[5]
  redis.call('ZADD', ix .. ':forget', score(forget), id)
  fit(ix .. ':forget', {ix, ix .. ':forget'})
end
local ex = P .. 'cntrs:expiring'
if expires ~= '0' then
  redis.call('ZADD', ex, expires, id)
  redis.call('ZADD', ex .. ':forget', score(forget), id)
  fit_expiring()
elseif redis.call('ZREM', ex, id) == 1 then
  redis.call('ZREM', ex .. ':forget', id)
  fit_expiring()
end
place(cur[5], id, ARGV[9], ARGV[10])
return {'ok', v, cur[4]}
`)

// scriptDeleteContainer: KEYS cntr; ARGV id owner.
var scriptDeleteContainer = script(`
local cur = redis.call('HMGET', KEYS[1], 'o', 'f')
if not cur[1] or cur[1] ~= ARGV[4] or dead(cur[2]) then return {'notfound'} end
drop_container(KEYS[1], ARGV[3])
return {'ok'}
`)

// scriptReapContainers: KEYS owner's container index. Drops the owner's forgotten containers and
// the index entries of containers that are gone.
var scriptReapContainers = script(`
local ix = KEYS[1]
local life = ix .. ':forget'
local ids = redis.call('ZRANGEBYSCORE', life, '-inf', NOW, 'LIMIT', 0, 1000)
for _, id in ipairs(ids) do
  local cntr = P .. 'cntr:' .. id
  local h = redis.call('HMGET', cntr, 'ix', 'f')
  if h[1] == ix and dead(h[2]) then
    drop_container(cntr, id)
  elseif h[1] == ix then
    redis.call('ZADD', life, score(h[2]), id)
  else
    redis.call('ZREM', ix, id)
    redis.call('ZREM', life, id)
  end
end
if #ids > 0 then fit(life, {ix, life}) end
return {'ok'}
`)

// scriptExpiringContainers: ARGV before limit. Returns {'ok', then id o v c f r per container},
// the earliest ExpiresAt first; members whose container is gone are removed on the way.
var scriptExpiringContainers = script(`
local ex = P .. 'cntrs:expiring'
local before, limit = ARGV[3], tonumber(ARGV[4])
local out, stale, found, off, full = {'ok'}, {}, 0, 0, false
while not full do
  local ids = redis.call('ZRANGEBYSCORE', ex, '-inf', before, 'LIMIT', off, 100)
  if #ids == 0 then break end
  off = off + #ids
  for _, id in ipairs(ids) do
    local cntr = P .. 'cntr:' .. id
    local h = redis.call('HMGET', cntr, 'o', 'v', 'c', 'f', 'r')
    if h[1] and not dead(h[4]) then
      if limit > 0 and found == limit then full = true break end
      found = found + 1
      out[#out + 1] = id
      for i = 1, 5 do out[#out + 1] = h[i] end
    else
      stale[#stale + 1] = id
    end
  end
end
for _, id in ipairs(stale) do
  local cntr = P .. 'cntr:' .. id
  if redis.call('EXISTS', cntr) == 1 then
    drop_container(cntr, id)
  else
    redis.call('ZREM', ex, id)
    redis.call('ZREM', ex .. ':forget', id)
  end
end
if #stale > 0 then fit_expiring() end
return out
`)

// scriptPutContainerFile: KEYS cntr, marker; ARGV owner container-id file-id record.
var scriptPutContainerFile = script(`
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
`)

// scriptDeleteContainerFile: KEYS cntr, marker; ARGV owner container-id file-id.
var scriptDeleteContainerFile = script(`
local cntr, marker = KEYS[1], KEYS[2]
local c = redis.call('HMGET', cntr, 'o', 'f')
if not c[1] or c[1] ~= ARGV[3] or dead(c[2]) then return {'notfound'} end
if redis.call('HDEL', cntr .. ':files', ARGV[5]) == 0 then return {'notfound'} end
if redis.call('GET', marker) == ARGV[4] then redis.call('DEL', marker) end
return {'ok'}
`)

// scriptUsage: KEYS owner's file index; ARGV grace. Returns {'ok', files, bytes} after dropping
// the owner's expired files.
var scriptUsage = script(`
local ix = KEYS[1]
reap(ix, ARGV[3])
return {'ok', redis.call('HLEN', ix .. ':size'), redis.call('GET', ix .. ':bytes') or '0'}
`)

// scriptBeginUpload: KEYS the owner's uploads, the owner's file index; ARGV grace upload-id
// max-uploads quota max-in-flight until. Reserves nothing yet but the upload's place among the
// owner's uploads in flight, until until. Returns {'ok'}, {'busy', uploads} (max-uploads
// reached), {'quota', used} (the owner's files and uploads hold the quota) or {'full', in flight}.
var scriptBeginUpload = script(`
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
`)

// scriptUploadChunk: KEYS upload, the owner's uploads, the owner's file index; ARGV upload-id
// bytes quota max-in-flight until ttl [chunk-index chunk]. Reserves bytes more for the upload,
// then stores the chunk when one is given: nothing reaches Redis unreserved. The upload's bytes
// and its reservation get the same lifetime. The owner's expired files are not dropped first
// (Begin and Commit do): one still counting can refuse a chunk, never let one too many in.
// Returns {'ok'}, {'quota', used}, {'full', in flight} or {'lost'} (the reservation ended).
var scriptUploadChunk = script(`
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
`)

// scriptAbortUpload: KEYS upload, the owner's uploads; ARGV upload-id.
var scriptAbortUpload = script(`
redis.call('UNLINK', KEYS[1])
drop_upload(KEYS[2], ARGV[3])
drop_upload(UPLOADS, ARGV[3])
return {'ok'}
`)

// scriptCommitFile: KEYS upload blob meta ix, the owner's uploads; ARGV grace id owner bytes
// chunks tail-index tail quota expires blob-id record. The upload's last chunk (tail, possibly
// empty; reserved already) is written here, and the upload renamed to the file's blob, only once
// the id and the quota are settled; its reservation becomes the file's bytes. A refused commit
// writes nothing. Returns {'ok'}, {'exists'}, {'quota', used} or {'lost'} (the upload's bytes and
// reservation expired before the commit).
var scriptCommitFile = script(`
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
`)

// scriptDeleteFile: KEYS meta; ARGV grace owner id. Returns {'ok', record} or {'notfound'}.
var scriptDeleteFile = script(`
local m = redis.call('HMGET', KEYS[1], 'o', 'e', 'ix', 'r')
if not m[1] or m[1] ~= ARGV[4] or dead(m[2]) then return {'notfound'} end
unindex(m[3], ARGV[5])
fit_files(m[3])
drop_meta(KEYS[1], ARGV[3])
return {'ok', m[4]}
`)

// scriptReapFiles: KEYS owner's file index; ARGV grace.
var scriptReapFiles = script(`
reap(KEYS[1], ARGV[3])
return {'ok'}
`)

// scriptClaim: KEYS claim; ARGV holder until-ms ttl-ms. Returns {'ok'} or {'held'}.
var scriptClaim = script(`
local v = redis.call('GET', KEYS[1])
if v then
  local sep = string.find(v, ':', 1, true)
  if string.sub(v, sep + 1) ~= ARGV[3] and NOW < tonumber(string.sub(v, 1, sep - 1)) then
    return {'held'}
  end
end
redis.call('SET', KEYS[1], ARGV[4] .. ':' .. ARGV[3], 'PX', ARGV[5])
return {'ok'}
`)

// scriptRelease: KEYS claim; ARGV holder.
var scriptRelease = script(`
local v = redis.call('GET', KEYS[1])
if v then
  local sep = string.find(v, ':', 1, true)
  if string.sub(v, sep + 1) == ARGV[3] then redis.call('DEL', KEYS[1]) end
end
return {'ok'}
`)

// scriptReservePlace: KEYS the owner's places; ARGV id max-per-owner max-shared shared until.
// Returns {status, the owner's places, the shared places (0 unless shared)}: 'ok' (reserved or
// already held), 'owner' or 'shared' (refused by that bound).
var scriptReservePlace = script(`
local z, id = KEYS[1], ARGV[3]
local mo, ms, shared, untl = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6] == '1', ARGV[7]
fit_places(z)
local n, m = redis.call('ZCARD', z), 0
if shared then
  fit_places(SHARED)
  m = redis.call('ZCARD', SHARED)
end
if redis.call('ZSCORE', z, id) then
  redis.call('ZADD', z, 'GT', untl, id)
  fit_places(z)
  if redis.call('ZSCORE', SHARED, id) then
    redis.call('ZADD', SHARED, 'GT', untl, id)
    fit_places(SHARED)
  end
  return {'ok', n, m}
end
if mo > 0 and n >= mo then return {'owner', n, m} end
if shared and ms > 0 and m >= ms then return {'shared', n, m} end
redis.call('ZADD', z, untl, id)
fit_places(z)
if shared then
  redis.call('ZADD', SHARED, untl, id)
  fit_places(SHARED)
  m = m + 1
end
return {'ok', n + 1, m}
`)

// scriptCancelPlace: KEYS the owner's places, cntr; ARGV id owner.
var scriptCancelPlace = script(`
local c = redis.call('HMGET', KEYS[2], 'o', 'f')
if c[1] == ARGV[4] and not dead(c[2]) then return {'ok'} end
if redis.call('ZREM', KEYS[1], ARGV[3]) == 1 then fit_places(KEYS[1]) end
if redis.call('ZREM', SHARED, ARGV[3]) == 1 then fit_places(SHARED) end
return {'ok'}
`)

// scriptPlaces: KEYS the owner's places. Returns {'ok', the owner's places, the shared places}.
var scriptPlaces = script(`
fit_places(KEYS[1])
fit_places(SHARED)
return {'ok', redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', SHARED)}
`)

// scriptTakeToken: KEYS bucket; ARGV per-minute burst. The bucket (t tokens at a ms) is timed by
// Redis's clock, not the replicas': every replica takes from it, and one clock makes its refill
// the same whichever replica asks. Returns {'ok'} or {'wait', ms until a token}.
var scriptTakeToken = script(`
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
`)
