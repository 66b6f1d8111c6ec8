-- prelude.lua runs before the body of every other script here (see scripts.go). Every script
-- takes ARGV[1] = the key prefix and ARGV[2] = the store's clock in milliseconds; its own
-- arguments follow. Each returns a table whose first element is a status ("ok", "exists",
-- "notfound", ...), never an error reply, so that an error reply always means Redis failed.
--
-- Keys a script derives from records (a container's files and markers, another owner's index on
-- a takeover) are not declared in KEYS: the store runs on one Redis, not a cluster (Open checks).
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
