package redisstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ciproxy/ciproxy/internal/store"
)

// containerRest is the r field of cntr:<id>: the record's JSON without what an update may not
// change (id, owner, creation time) and the version, which are fields of their own that the
// scripts check.
func containerRest(c store.Container) ([]byte, error) {
	id := c.ID
	c.ID, c.Owner, c.CreatedAt, c.Version = "", "", time.Time{}, 0
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("%w: encoding container %s: %w", store.ErrInvalid, id, err)
	}
	return b, nil
}

// containerFields are the fields of cntr:<id> a read needs, in the order decodeContainer takes.
var containerFields = []string{"o", "v", "c", "f", "r"}

// decodeContainer builds container id from its fields (containerFields' order), or reports
// false when it does not exist, belongs to someone other than owner ("" for anyone) or is
// forgotten by now.
func decodeContainer(id, owner string, f []any, now int64) (store.Container, bool, error) {
	o, ok := f[0].(string)
	if !ok || (owner != "" && o != owner) {
		return store.Container{}, false, nil
	}
	if forget, _ := strconv.ParseInt(str(f[3]), 10, 64); expiredMs(forget, now) {
		return store.Container{}, false, nil
	}
	var c store.Container
	if err := json.Unmarshal([]byte(str(f[4])), &c); err != nil {
		return store.Container{}, false, fmt.Errorf("redis store: container %s: %w", id, err)
	}
	v, err := strconv.ParseInt(str(f[1]), 10, 64)
	if err != nil {
		return store.Container{}, false, fmt.Errorf("redis store: container %s: version: %w", id, err)
	}
	var created time.Time
	if err := created.UnmarshalText([]byte(str(f[2]))); err != nil {
		return store.Container{}, false, fmt.Errorf("redis store: container %s: created: %w", id, err)
	}
	// The fields of their own are what counts, whatever the JSON says.
	c.ID, c.Owner, c.CreatedAt, c.Version = id, o, created, v
	return c, true, nil
}

func notFound(what, id string) error { return fmt.Errorf("%s %s: %w", what, id, store.ErrNotFound) }

// CreateContainer implements [store.Containers.CreateContainer].
func (s *Store) CreateContainer(ctx context.Context, c store.Container) (store.Container, error) {
	if c.ID != "" && !store.ContainerKind.Valid(c.ID) {
		return store.Container{}, fmt.Errorf("%w: %q is not a container id", store.ErrInvalid, c.ID)
	}
	if err := s.checkOpen(); err != nil {
		return store.Container{}, err
	}
	if c.ID == "" {
		c.ID = s.NewID(store.ContainerKind)
	}
	if c.CreatedAt.IsZero() {
		c.CreatedAt = s.now().Round(0)
	}
	c.Version = 1
	body, err := containerRest(c)
	if err != nil {
		return store.Container{}, err
	}
	created, err := c.CreatedAt.MarshalText()
	if err != nil {
		return store.Container{}, fmt.Errorf("%w: container %s: %w", store.ErrInvalid, c.ID, err)
	}
	v, err := s.lua.createContainer.Run(ctx, s.rdb, []string{s.key("cntr", c.ID)}, s.prefix, s.nowMs(),
		c.ID, c.Owner, s.ownerKey(c.Owner, "cntrs"), created, atMs(c.ForgetAt), atMs(c.ExpiresAt), body,
		atMs(store.PlaceUntil(c)), sharedFlag(c)).Result()
	if err != nil {
		return store.Container{}, s.fail(ctx, err)
	}
	switch st, _, err := status(v); {
	case err != nil:
		return store.Container{}, err
	case st == "exists":
		return store.Container{}, fmt.Errorf("container %s: %w", c.ID, store.ErrExists)
	}
	return c, nil
}

// Container implements [store.Containers.Container].
func (s *Store) Container(ctx context.Context, owner, id string) (store.Container, error) {
	if err := s.checkOpen(); err != nil {
		return store.Container{}, err
	}
	if !store.ContainerKind.Valid(id) {
		return store.Container{}, notFound("container", id)
	}
	f, err := s.rdb.HMGet(ctx, s.key("cntr", id), containerFields...).Result()
	if err != nil {
		return store.Container{}, s.fail(ctx, err)
	}
	c, ok, err := decodeContainer(id, owner, f, s.nowMs())
	if err == nil && !ok {
		err = notFound("container", id)
	}
	return c, err
}

// UpdateContainer implements [store.Containers.UpdateContainer].
func (s *Store) UpdateContainer(ctx context.Context, c store.Container) (store.Container, error) {
	if err := s.checkOpen(); err != nil {
		return store.Container{}, err
	}
	if !store.ContainerKind.Valid(c.ID) {
		return store.Container{}, notFound("container", c.ID)
	}
	body, err := containerRest(c)
	if err != nil {
		return store.Container{}, err
	}
	v, err := s.lua.updateContainer.Run(ctx, s.rdb, []string{s.key("cntr", c.ID)}, s.prefix, s.nowMs(),
		c.ID, c.Owner, c.Version, atMs(c.ForgetAt), atMs(c.ExpiresAt), body,
		atMs(store.PlaceUntil(c)), sharedFlag(c)).Result()
	if err != nil {
		return store.Container{}, s.fail(ctx, err)
	}
	st, rest, err := status(v)
	switch {
	case err != nil:
		return store.Container{}, err
	case st == "notfound":
		return store.Container{}, notFound("container", c.ID)
	case st == "conflict":
		return store.Container{}, fmt.Errorf("container %s: version %s, not %d: %w", c.ID, str(rest[0]), c.Version, store.ErrConflict)
	case st != "ok" || len(rest) != 2:
		return store.Container{}, fmt.Errorf("redis store: unexpected reply %v", v)
	}
	c.Version, _ = rest[0].(int64)
	if err := c.CreatedAt.UnmarshalText([]byte(str(rest[1]))); err != nil {
		return store.Container{}, fmt.Errorf("redis store: container %s: created: %w", c.ID, err)
	}
	return c, nil
}

// DeleteContainer implements [store.Containers.DeleteContainer].
func (s *Store) DeleteContainer(ctx context.Context, owner, id string) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	if !store.ContainerKind.Valid(id) {
		return notFound("container", id)
	}
	v, err := s.lua.deleteContainer.Run(ctx, s.rdb, []string{s.key("cntr", id)}, s.prefix, s.nowMs(), id, owner).Result()
	if err != nil {
		return s.fail(ctx, err)
	}
	if st, _, err := status(v); err != nil || st != "ok" {
		return cmp.Or(err, notFound("container", id))
	}
	return nil
}

// ListContainers implements [store.Containers.ListContainers]. The owner's forgotten containers
// are dropped first.
func (s *Store) ListContainers(ctx context.Context, owner string, q store.ContainerQuery) (store.List[store.Container], error) {
	if q.After != "" && !store.ContainerKind.Valid(q.After) {
		return store.List[store.Container]{}, fmt.Errorf("%w: after %q is not a container id", store.ErrInvalid, q.After)
	}
	if err := s.checkOpen(); err != nil {
		return store.List[store.Container]{}, err
	}
	ix := s.ownerKey(owner, "cntrs")
	if err := s.lua.reapContainers.Run(ctx, s.rdb, []string{ix}, s.prefix, s.nowMs()).Err(); err != nil {
		return store.List[store.Container]{}, s.fail(ctx, err)
	}
	return pageIndex(ctx, s, ix, q.Page, func(ctx context.Context, ids []string) ([]store.Container, []bool, error) {
		cmds := make([]*redis.SliceCmd, len(ids))
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				cmds[i] = p.HMGet(ctx, s.key("cntr", id), containerFields...)
			}
			return nil
		}); err != nil {
			return nil, nil, s.fail(ctx, err)
		}
		now := s.nowMs()
		out, ok := make([]store.Container, len(ids)), make([]bool, len(ids))
		for i, cmd := range cmds {
			c, live, err := decodeContainer(ids[i], owner, cmd.Val(), now)
			if err != nil {
				return nil, nil, err
			}
			out[i], ok[i] = c, live && (q.Name == "" || c.Name == q.Name)
		}
		return out, ok, nil
	})
}

// ExpiringContainers implements [store.Containers.ExpiringContainers].
func (s *Store) ExpiringContainers(ctx context.Context, before time.Time, limit int) ([]store.Container, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	v, err := s.lua.expiringContainers.Run(ctx, s.rdb, nil, s.prefix, s.nowMs(), before.UnixMilli(), max(limit, 0)).Result()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	_, rest, err := status(v)
	if err != nil {
		return nil, err
	}
	now := s.nowMs()
	var out []store.Container
	for i := 0; i+6 <= len(rest); i += 6 {
		c, ok, err := decodeContainer(str(rest[i]), "", rest[i+1:i+6], now)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, c)
		}
	}
	return out, nil
}

// PutContainerFile implements [store.ContainerFiles.PutContainerFile].
func (s *Store) PutContainerFile(ctx context.Context, f store.ContainerFile) (store.ContainerFile, error) {
	if f.ID != "" && !store.ContainerFileKind.Valid(f.ID) {
		return store.ContainerFile{}, fmt.Errorf("%w: %q is not a container file id", store.ErrInvalid, f.ID)
	}
	if err := s.checkOpen(); err != nil {
		return store.ContainerFile{}, err
	}
	if !store.ContainerKind.Valid(f.ContainerID) {
		return store.ContainerFile{}, notFound("container", f.ContainerID)
	}
	if f.ID == "" {
		f.ID = s.NewID(store.ContainerFileKind)
	}
	if f.CreatedAt.IsZero() {
		f.CreatedAt = s.now().Round(0)
	}
	rec, err := json.Marshal(f)
	if err != nil {
		return store.ContainerFile{}, fmt.Errorf("%w: encoding container file %s: %w", store.ErrInvalid, f.ID, err)
	}
	v, err := s.lua.putContainerFile.Run(ctx, s.rdb, []string{s.key("cntr", f.ContainerID), s.key("cfile", f.ID)}, s.prefix, s.nowMs(),
		f.Owner, f.ContainerID, f.ID, rec).Result()
	if err != nil {
		return store.ContainerFile{}, s.fail(ctx, err)
	}
	switch st, _, err := status(v); {
	case err != nil:
		return store.ContainerFile{}, err
	case st == "notfound":
		return store.ContainerFile{}, notFound("container", f.ContainerID)
	case st == "exists":
		return store.ContainerFile{}, fmt.Errorf("container file %s: %w", f.ID, store.ErrExists)
	}
	return f, nil
}

// liveContainer reports whether the fields o and f of a container say it is owner's and not
// forgotten.
func liveContainer(f []any, owner string, now int64) bool {
	o, ok := f[0].(string)
	forget, _ := strconv.ParseInt(str(f[1]), 10, 64)
	return ok && o == owner && !expiredMs(forget, now)
}

// ContainerFile implements [store.ContainerFiles.ContainerFile].
func (s *Store) ContainerFile(ctx context.Context, owner, containerID, id string) (store.ContainerFile, error) {
	if err := s.checkOpen(); err != nil {
		return store.ContainerFile{}, err
	}
	if !store.ContainerKind.Valid(containerID) || !store.ContainerFileKind.Valid(id) {
		return store.ContainerFile{}, notFound("container file", id)
	}
	var head *redis.SliceCmd
	var rec *redis.StringCmd
	cntr := s.key("cntr", containerID)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		head = p.HMGet(ctx, cntr, "o", "f")
		rec = p.HGet(ctx, cntr+":files", id)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return store.ContainerFile{}, s.fail(ctx, err)
	}
	if !liveContainer(head.Val(), owner, s.nowMs()) {
		return store.ContainerFile{}, notFound("container", containerID)
	}
	b, err := rec.Bytes()
	if errors.Is(err, redis.Nil) {
		return store.ContainerFile{}, notFound("container file", id)
	}
	var r store.ContainerFile
	if err := json.Unmarshal(b, &r); err != nil {
		return store.ContainerFile{}, fmt.Errorf("redis store: container file %s: %w", id, err)
	}
	return r, nil
}

// ListContainerFiles implements [store.ContainerFiles.ListContainerFiles]. A container's files
// are one hash, read whole and sorted here: a container holds what fits in its /mnt/data.
func (s *Store) ListContainerFiles(ctx context.Context, owner, containerID string, q store.ContainerFileQuery) (store.List[store.ContainerFile], error) {
	if q.After != "" && !store.ContainerFileKind.Valid(q.After) {
		return store.List[store.ContainerFile]{}, fmt.Errorf("%w: after %q is not a container file id", store.ErrInvalid, q.After)
	}
	if err := s.checkOpen(); err != nil {
		return store.List[store.ContainerFile]{}, err
	}
	if !store.ContainerKind.Valid(containerID) {
		return store.List[store.ContainerFile]{}, notFound("container", containerID)
	}
	var head *redis.SliceCmd
	var recs *redis.StringSliceCmd
	cntr := s.key("cntr", containerID)
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		head = p.HMGet(ctx, cntr, "o", "f")
		recs = p.HVals(ctx, cntr+":files")
		return nil
	}); err != nil {
		return store.List[store.ContainerFile]{}, s.fail(ctx, err)
	}
	if !liveContainer(head.Val(), owner, s.nowMs()) {
		return store.List[store.ContainerFile]{}, notFound("container", containerID)
	}
	var files []store.ContainerFile
	for _, b := range recs.Val() {
		var r store.ContainerFile
		if err := json.Unmarshal([]byte(b), &r); err != nil {
			return store.List[store.ContainerFile]{}, fmt.Errorf("redis store: a file of container %s: %w", containerID, err)
		}
		if q.Path == "" || r.Path == q.Path {
			files = append(files, r)
		}
	}
	slices.SortFunc(files, func(a, b store.ContainerFile) int { return cmp.Compare(a.ID, b.ID) })
	return pageSorted(files, func(f store.ContainerFile) string { return f.ID }, q.Page), nil
}

// DeleteContainerFile implements [store.ContainerFiles.DeleteContainerFile].
func (s *Store) DeleteContainerFile(ctx context.Context, owner, containerID, id string) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	if !store.ContainerKind.Valid(containerID) || !store.ContainerFileKind.Valid(id) {
		return notFound("container file", id)
	}
	v, err := s.lua.deleteContainerFile.Run(ctx, s.rdb, []string{s.key("cntr", containerID), s.key("cfile", id)}, s.prefix, s.nowMs(),
		owner, containerID, id).Result()
	if err != nil {
		return s.fail(ctx, err)
	}
	if st, _, err := status(v); err != nil || st != "ok" {
		return cmp.Or(err, notFound("container file", id))
	}
	return nil
}

var (
	_ store.Containers     = (*Store)(nil)
	_ store.ContainerFiles = (*Store)(nil)
)
