package redisstore

import (
	"embed"
	"fmt"
	"io/fs"

	"github.com/redis/go-redis/v9"
)

// luaFiles are the store's Lua scripts: lua/prelude.lua, the helpers every script shares, and one
// file per script, which runs atomically in Redis as the prelude followed by its body. Each file
// opens with what it takes and returns.
//
//go:embed lua/*.lua
var luaFiles embed.FS

// scripts are the store's scripts, built once by Open. Running one sends its SHA1 only, and the
// whole script the first time a Redis has not seen it.
type scripts struct {
	mint                *redis.Script
	createContainer     *redis.Script
	updateContainer     *redis.Script
	deleteContainer     *redis.Script
	reapContainers      *redis.Script
	expiringContainers  *redis.Script
	putContainerFile    *redis.Script
	deleteContainerFile *redis.Script
	usage               *redis.Script
	beginUpload         *redis.Script
	uploadChunk         *redis.Script
	abortUpload         *redis.Script
	commitFile          *redis.Script
	deleteFile          *redis.Script
	reapFiles           *redis.Script
	claim               *redis.Script
	release             *redis.Script
	reservePlace        *redis.Script
	cancelPlace         *redis.Script
	places              *redis.Script
	takeToken           *redis.Script
}

// loadScripts builds every script from its file. A file no field takes is an error too, so that
// a script cannot be added and forgotten.
func loadScripts() (*scripts, error) {
	prelude, err := luaFiles.ReadFile("lua/prelude.lua")
	if err != nil {
		return nil, fmt.Errorf("redis store: %w", err)
	}
	sc := &scripts{}
	byFile := map[string]**redis.Script{
		"mint": &sc.mint, "create_container": &sc.createContainer, "update_container": &sc.updateContainer,
		"delete_container": &sc.deleteContainer, "reap_containers": &sc.reapContainers,
		"expiring_containers": &sc.expiringContainers, "put_container_file": &sc.putContainerFile,
		"delete_container_file": &sc.deleteContainerFile, "usage": &sc.usage, "begin_upload": &sc.beginUpload,
		"upload_chunk": &sc.uploadChunk, "abort_upload": &sc.abortUpload, "commit_file": &sc.commitFile,
		"delete_file": &sc.deleteFile, "reap_files": &sc.reapFiles, "claim": &sc.claim, "release": &sc.release,
		"reserve_place": &sc.reservePlace, "cancel_place": &sc.cancelPlace, "places": &sc.places,
		"take_token": &sc.takeToken,
	}
	for name, dst := range byFile {
		body, err := luaFiles.ReadFile("lua/" + name + ".lua")
		if err != nil {
			return nil, fmt.Errorf("redis store: %w", err)
		}
		*dst = redis.NewScript(string(prelude) + string(body))
	}
	if files, err := fs.Glob(luaFiles, "lua/*.lua"); err != nil || len(files) != len(byFile)+1 {
		return nil, fmt.Errorf("redis store: %d script files for %d scripts and the prelude (%v)", len(files), len(byFile), err)
	}
	return sc, nil
}
