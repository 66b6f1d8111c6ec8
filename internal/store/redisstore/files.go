package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/ciproxy/ciproxy/internal/store"
)

// fileFields are the fields of file:<id> a read needs, in the order decodeFile takes.
var fileFields = []string{"o", "e", "r", "b"}

// decodeFile builds a file from its fields, or reports false when it does not exist, is another
// owner's or has expired by now. blob is the id of its bytes.
func decodeFile(id, owner string, f []any, now int64) (file store.File, blob string, ok bool, err error) {
	o, isStr := f[0].(string)
	if !isStr || o != owner {
		return store.File{}, "", false, nil
	}
	if at, _ := strconv.ParseInt(str(f[1]), 10, 64); expiredMs(at, now) {
		return store.File{}, "", false, nil
	}
	var r store.File
	if err := json.Unmarshal([]byte(str(f[2])), &r); err != nil {
		return store.File{}, "", false, fmt.Errorf("redis store: file %s: %w", id, err)
	}
	return r, str(f[3]), true, nil
}

// Usage implements [store.Files.Usage]. The owner's expired files are dropped first.
func (s *Store) Usage(ctx context.Context, owner string) (store.Usage, error) {
	if err := s.checkOpen(); err != nil {
		return store.Usage{}, err
	}
	v, err := s.lua.usage.Run(ctx, s.rdb, []string{s.ownerKey(owner, "files")}, s.prefix, s.nowMs(), s.readGrace.Milliseconds()).Result()
	if err != nil {
		return store.Usage{}, s.fail(ctx, err)
	}
	_, rest, err := status(v)
	if err != nil || len(rest) != 2 {
		return store.Usage{}, fmt.Errorf("redis store: unexpected usage reply %v (%w)", v, err)
	}
	files, _ := rest[0].(int64)
	bytes, err := strconv.ParseInt(str(rest[1]), 10, 64)
	if err != nil {
		return store.Usage{}, fmt.Errorf("redis store: usage of %s: %w", owner, err)
	}
	return store.Usage{Files: int(files), Bytes: bytes}, nil
}

// BeginFile implements [store.Files.BeginFile]. It holds the upload's place among the owner's
// uploads in flight; no byte is written to Redis until the first chunk is full.
func (s *Store) BeginFile(ctx context.Context, owner string, lim store.FileLimits) (store.FileUpload, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	up := &upload{s: s, owner: owner, lim: lim, blob: randomHex(16)}
	v, err := s.lua.beginUpload.Run(ctx, s.rdb, []string{up.reservations(), s.ownerKey(owner, "files")}, s.prefix, s.nowMs(), s.readGrace.Milliseconds(),
		up.blob, lim.MaxUploads, lim.OwnerBytes, lim.MaxInFlight, s.nowMs()+s.uploadTTL.Milliseconds()).Result()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	if err := up.refused(v); err != nil {
		return nil, err
	}
	up.buf = s.chunks.Get().(*[]byte)
	return up, nil
}

// upload is a file being written to upload:<blob>, one chunk at a time.
type upload struct {
	s        *Store
	owner    string
	lim      store.FileLimits
	blob     string
	buf      *[]byte // the chunk being filled; nil once committed or aborted
	fill     int     // bytes in *buf
	chunks   int     // full chunks stored in Redis
	n        int64
	reserved int64 // of n
	failed   bool
}

func (u *upload) key() string { return u.s.key("upload", u.blob) }

// reservations is the zset of the owner's uploads in flight.
func (u *upload) reservations() string { return u.s.ownerKey(u.owner, "uploads") }

// refused reads the reply of a script that reserves for the upload: nil when it did.
func (u *upload) refused(v any) error {
	st, rest, err := status(v)
	switch {
	case err != nil:
		return err
	case st == "ok":
		return nil
	case st == "busy" && len(rest) == 1:
		return fmt.Errorf("%w: %s of %d", store.ErrTooManyUploads, str(rest[0]), u.lim.MaxUploads)
	case st == "quota" && len(rest) == 1:
		return fmt.Errorf("%w: %s bytes in files and uploads, %d allowed", store.ErrQuota, str(rest[0]), u.lim.OwnerBytes)
	case st == "full" && len(rest) == 1:
		return fmt.Errorf("%w: %s bytes in flight, %d allowed", store.ErrInFlightFull, str(rest[0]), u.lim.MaxInFlight)
	case st == "lost":
		return fmt.Errorf("redis store: the upload's reservation expired (more than %s between two chunks)", u.s.uploadTTL)
	}
	return fmt.Errorf("redis store: unexpected reply %v", v)
}

// Write implements [store.FileUpload.Write]. Each full chunk is reserved and stored by one
// script; what is left in memory at the end is reserved too before Write returns.
func (u *upload) Write(ctx context.Context, r io.Reader) (int64, error) {
	if u.buf == nil || u.failed {
		return 0, fmt.Errorf("%w: the upload is finished", store.ErrInvalid)
	}
	if err := u.s.checkOpen(); err != nil {
		u.failed = true
		return 0, err
	}
	src := r
	if u.lim.MaxBytes > 0 {
		// One byte past the limit tells "exactly max" from "more than max".
		src = io.LimitReader(r, u.lim.MaxBytes-u.n+1)
	}
	written, err := u.copy(ctx, src)
	if err == nil && u.n > u.reserved {
		err = u.reserve(ctx, nil)
	}
	if err != nil {
		u.failed = true
	}
	return written, err
}

// copy reads src into chunks, storing each one as it fills.
func (u *upload) copy(ctx context.Context, src io.Reader) (int64, error) {
	var written int64
	buf := *u.buf
	for {
		if err := ctx.Err(); err != nil {
			return written, err
		}
		m, err := src.Read(buf[u.fill:])
		u.fill += m
		u.n += int64(m)
		written += int64(m)
		if u.lim.MaxBytes > 0 && u.n > u.lim.MaxBytes {
			return written, fmt.Errorf("%w: more than %d bytes", store.ErrTooLarge, u.lim.MaxBytes)
		}
		if u.fill == len(buf) {
			if ferr := u.reserve(ctx, buf); ferr != nil {
				return written, ferr
			}
			u.chunks++
			u.fill = 0
		}
		switch {
		case errors.Is(err, io.EOF):
			return written, nil
		case err != nil:
			return written, fmt.Errorf("redis store: storing a file: %w", err)
		}
	}
}

// reserve reserves the bytes written since the last reservation and stores chunk (when not nil)
// as the next one, in one script, so that no chunk is ever stored unreserved or without a TTL.
func (u *upload) reserve(ctx context.Context, chunk []byte) error {
	s := u.s
	args := []any{s.prefix, s.nowMs(), u.blob, u.n - u.reserved, u.lim.OwnerBytes, u.lim.MaxInFlight,
		s.nowMs() + s.uploadTTL.Milliseconds(), s.uploadTTL.Milliseconds()}
	if chunk != nil {
		args = append(args, u.chunks, chunk)
	}
	v, err := s.lua.uploadChunk.Run(ctx, s.rdb, []string{u.key(), u.reservations(), s.ownerKey(u.owner, "files")}, args...).Result()
	if err != nil {
		return s.fail(ctx, err)
	}
	if err := u.refused(v); err != nil {
		return err
	}
	u.reserved = u.n
	return nil
}

// Commit implements [store.FileUpload.Commit]: the last chunk, the id, the quota, the bytes, the
// metadata and the end of the reservation are settled by one script.
func (u *upload) Commit(ctx context.Context, f store.File) (store.File, error) {
	if u.buf == nil || u.failed {
		return store.File{}, fmt.Errorf("%w: the upload is finished", store.ErrInvalid)
	}
	defer func() { _ = u.Abort() }()
	s := u.s
	if f.ID != "" && !store.FileKind.Valid(f.ID) {
		return store.File{}, fmt.Errorf("%w: %q is not a file id", store.ErrInvalid, f.ID)
	}
	if err := s.checkOpen(); err != nil {
		return store.File{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.File{}, err
	}
	if f.ID == "" {
		f.ID = s.NewID(store.FileKind)
	}
	if f.CreatedAt.IsZero() {
		f.CreatedAt = s.now().Round(0)
	}
	f.Owner, f.Bytes = u.owner, u.n
	rec, err := json.Marshal(f)
	if err != nil {
		return store.File{}, fmt.Errorf("%w: encoding file %s: %w", store.ErrInvalid, f.ID, err)
	}
	chunks := u.chunks
	tail := (*u.buf)[:u.fill]
	if len(tail) > 0 {
		chunks++
	}
	keys := []string{u.key(), s.key("blob", u.blob), s.key("file", f.ID), s.ownerKey(u.owner, "files"), u.reservations()}
	v, err := s.lua.commitFile.Run(ctx, s.rdb, keys, s.prefix, s.nowMs(), s.readGrace.Milliseconds(),
		f.ID, u.owner, u.n, chunks, u.chunks, tail, u.lim.OwnerBytes, atMs(f.ExpiresAt), u.blob, rec).Result()
	if err != nil {
		return store.File{}, s.fail(ctx, err)
	}
	st, rest, err := status(v)
	switch {
	case err != nil:
		return store.File{}, err
	case st == "exists":
		return store.File{}, fmt.Errorf("file %s: %w", f.ID, store.ErrExists)
	case st == "quota":
		return store.File{}, fmt.Errorf("%w: %s bytes in use, %d more asked, %d allowed", store.ErrQuota, str(rest[0]), u.n, u.lim.OwnerBytes)
	case st == "lost":
		return store.File{}, fmt.Errorf("redis store: the upload's bytes expired before it was committed (more than %s between two chunks)", s.uploadTTL)
	case st != "ok":
		return store.File{}, fmt.Errorf("redis store: unexpected commit reply %v", v)
	}
	u.release()
	return f, nil
}

// release gives the chunk buffer back; the upload is then finished.
func (u *upload) release() {
	if u.buf != nil {
		u.s.chunks.Put(u.buf)
		u.buf = nil
	}
}

// Abort implements [store.FileUpload.Abort]: the chunks and the reservation go together. When
// Redis cannot be reached (or the store is closed) they are left to expire with the upload's TTL.
func (u *upload) Abort() error {
	if u.buf == nil {
		return nil
	}
	u.release()
	if u.s.checkOpen() != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), u.s.rdb.Options().ReadTimeout)
	defer cancel()
	return u.s.fail(ctx, u.s.lua.abortUpload.Run(ctx, u.s.rdb, []string{u.key(), u.reservations()}, u.s.prefix, u.s.nowMs(), u.blob).Err())
}

// File implements [store.Files.File].
func (s *Store) File(ctx context.Context, owner, id string) (store.File, error) {
	f, _, err := s.fileMeta(ctx, owner, id)
	return f, err
}

func (s *Store) fileMeta(ctx context.Context, owner, id string) (store.File, string, error) {
	if err := s.checkOpen(); err != nil {
		return store.File{}, "", err
	}
	if !store.FileKind.Valid(id) {
		return store.File{}, "", notFound("file", id)
	}
	fields, err := s.rdb.HMGet(ctx, s.key("file", id), fileFields...).Result()
	if err != nil {
		return store.File{}, "", s.fail(ctx, err)
	}
	f, blob, ok, err := decodeFile(id, owner, fields, s.nowMs())
	if err == nil && !ok {
		err = notFound("file", id)
	}
	return f, blob, err
}

// OpenFile implements [store.Files.OpenFile]. The reader fetches one chunk at a time with ctx,
// and keeps the bytes of a file deleted meanwhile alive for ReadGrace after each chunk.
func (s *Store) OpenFile(ctx context.Context, owner, id string) (store.File, io.ReadCloser, error) {
	f, blob, err := s.fileMeta(ctx, owner, id)
	if err != nil {
		return store.File{}, nil, err
	}
	return f, &blobReader{s: s, ctx: ctx, key: s.key("blob", blob), id: id, size: f.Bytes}, nil
}

// blobReader reads blob:<b> chunk by chunk.
type blobReader struct {
	s       *Store
	ctx     context.Context
	key, id string
	size    int64
	fetched int64  // bytes of the chunks fetched so far
	next    int    // the next chunk to fetch
	chunk   string // what is left of the current chunk
	closed  bool
}

func (r *blobReader) Read(p []byte) (int, error) {
	if r.closed {
		return 0, fmt.Errorf("redis store: read of a closed file")
	}
	for r.chunk == "" {
		if r.fetched >= r.size {
			return 0, io.EOF
		}
		if err := r.fetch(); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.chunk)
	r.chunk = r.chunk[n:]
	return n, nil
}

func (r *blobReader) fetch() error {
	if err := r.s.checkOpen(); err != nil {
		return err
	}
	var get *redis.StringCmd
	_, err := r.s.rdb.Pipelined(r.ctx, func(p redis.Pipeliner) error {
		get = p.HGet(r.ctx, r.key, strconv.Itoa(r.next))
		p.Do(r.ctx, "pexpire", r.key, r.s.readGrace.Milliseconds(), "gt")
		return nil
	})
	if errors.Is(err, redis.Nil) {
		return fmt.Errorf("redis store: the bytes of file %s are gone after %d of %d: %w", r.id, r.fetched, r.size, io.ErrUnexpectedEOF)
	}
	if err != nil {
		return r.s.fail(r.ctx, err)
	}
	c := get.Val()
	if c == "" || r.fetched+int64(len(c)) > r.size {
		return fmt.Errorf("redis store: the bytes of file %s do not match its size %d", r.id, r.size)
	}
	r.chunk, r.fetched = c, r.fetched+int64(len(c))
	r.next++
	return nil
}

func (r *blobReader) Close() error {
	r.closed, r.chunk = true, ""
	return nil
}

// ListFiles implements [store.Files.ListFiles]. The owner's expired files are dropped first.
func (s *Store) ListFiles(ctx context.Context, owner string, q store.FileQuery) (store.List[store.File], error) {
	if q.After != "" && !store.FileKind.Valid(q.After) {
		return store.List[store.File]{}, fmt.Errorf("%w: after %q is not a file id", store.ErrInvalid, q.After)
	}
	if err := s.checkOpen(); err != nil {
		return store.List[store.File]{}, err
	}
	ix := s.ownerKey(owner, "files")
	if err := s.lua.reapFiles.Run(ctx, s.rdb, []string{ix}, s.prefix, s.nowMs(), s.readGrace.Milliseconds()).Err(); err != nil {
		return store.List[store.File]{}, s.fail(ctx, err)
	}
	return pageIndex(ctx, s, ix, q.Page, func(ctx context.Context, ids []string) ([]store.File, []bool, error) {
		cmds := make([]*redis.SliceCmd, len(ids))
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				cmds[i] = p.HMGet(ctx, s.key("file", id), fileFields...)
			}
			return nil
		}); err != nil {
			return nil, nil, s.fail(ctx, err)
		}
		now := s.nowMs()
		out, ok := make([]store.File, len(ids)), make([]bool, len(ids))
		for i, cmd := range cmds {
			f, _, live, err := decodeFile(ids[i], owner, cmd.Val(), now)
			if err != nil {
				return nil, nil, err
			}
			out[i], ok[i] = f, live && (q.Purpose == "" || f.Purpose == q.Purpose)
		}
		return out, ok, nil
	})
}

// DeleteFile implements [store.Files.DeleteFile].
func (s *Store) DeleteFile(ctx context.Context, owner, id string) (store.File, error) {
	if err := s.checkOpen(); err != nil {
		return store.File{}, err
	}
	if !store.FileKind.Valid(id) {
		return store.File{}, notFound("file", id)
	}
	v, err := s.lua.deleteFile.Run(ctx, s.rdb, []string{s.key("file", id)}, s.prefix, s.nowMs(), s.readGrace.Milliseconds(), owner, id).Result()
	if err != nil {
		return store.File{}, s.fail(ctx, err)
	}
	st, rest, err := status(v)
	switch {
	case err != nil:
		return store.File{}, err
	case st != "ok" || len(rest) != 1:
		return store.File{}, notFound("file", id)
	}
	var r store.File
	if err := json.Unmarshal([]byte(str(rest[0])), &r); err != nil {
		return store.File{}, fmt.Errorf("redis store: file %s: %w", id, err)
	}
	return r, nil
}

var _ store.Files = (*Store)(nil)
