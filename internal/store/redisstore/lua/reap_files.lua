-- reap_files.lua: KEYS owner's file index; ARGV grace.
reap(KEYS[1], ARGV[3])
return {'ok'}
