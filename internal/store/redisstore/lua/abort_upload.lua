-- abort_upload.lua: KEYS upload, the owner's uploads; ARGV upload-id.
redis.call('UNLINK', KEYS[1])
drop_upload(KEYS[2], ARGV[3])
drop_upload(UPLOADS, ARGV[3])
return {'ok'}
