// Package redisstore is the shared store.Store: every piece of state in one Redis (7.0 or later,
// not Redis Cluster), so that any replica of the proxy answers any request.
//
// # Layout
//
// Every key starts with Options.Prefix ("ciproxy:" by default); <o> is an owner with '%' and ':'
// percent-encoded, so that no owner's keys can be mistaken for another's.
//
//	resp:<id>                 string  a stored response (JSON)
//	call:<id>                 string  a code_interpreter_call (JSON)
//	cntr:<id>                 hash    a container: o owner, v version, c created, f forget ms,
//	                                  e expires ms, ix its owner's index, r the rest (JSON)
//	cntr:<id>:files           hash    its container files: cfile id -> record (JSON)
//	cfile:<id>                string  the container a cfile id belongs to
//	owner:<o>:cntrs           zset    the owner's container ids (all scores 0: id order, which is
//	                                  mint order)
//	owner:<o>:cntrs:forget    zset    the same ids scored by ForgetAt (+inf: never)
//	cntrs:expiring            zset    containers scored by ExpiresAt, for the janitor
//	cntrs:expiring:forget     zset    the same ids scored by ForgetAt
//	file:<id>                 hash    a Files API file: o owner, n bytes, b blob, e expires ms,
//	                                  ix its owner's index, r the record (JSON)
//	blob:<b>                  hash    a committed file's bytes: chunk number -> up to ChunkSize bytes
//	upload:<b>                hash    the same, for an upload in progress
//	owner:<o>:files           zset    the owner's file ids in mint order
//	owner:<o>:files:exp       zset    the same ids scored by ExpiresAt (+inf: never)
//	owner:<o>:files:size      hash    file id -> bytes
//	owner:<o>:files:bytes     string  the sum of the sizes: with the bytes of the owner's
//	                                  uploads in flight, the owner's quota use
//	owner:<o>:uploads         zset    the owner's uploads in flight (blob ids), scored by when
//	                                  their reservation ends (ms)
//	owner:<o>:uploads:n       hash    blob id -> the bytes that upload has reserved
//	uploads                   zset    every owner's uploads in flight, likewise
//	uploads:n                 hash    blob id -> bytes, for them
//	owner:<o>:places          zset    the owner's containers holding a place (store.Quotas),
//	                                  scored by when it ends (ms)
//	places:shared             zset    the same for every owner's containers whose Host is ""
//	bucket:<k>                hash    a token bucket: t tokens at a (Redis's clock, ms)
//	claim:<key>               string  "<until ms>:<holder>"
//	idclock                   string  the last millisecond an id was minted for
//	secret                    string  the replicas' shared secret when their configuration sets
//	                                  none (SharedSecret; no expiry)
//
// # Expiry
//
// A key lives exactly as long as what it describes. A record's key expires at its ExpiresAt
// (ForgetAt for a container, whose files and cfile markers share its lifetime); an index's keys
// expire with the longest-lived member of the index (its companion zset scored by expiry says
// which one), and lose their expired members lazily, whenever a script reads or writes that
// index. A claim expires with its lease, an upload (its bytes and its reservation alike)
// UploadTTL after its last chunk, idclock a day
// after the last id, a places zset with its last place, a bucket when it has refilled.
//
// Expiry times are sent to Redis as durations from the store's own clock (PEXPIRE, not
// PEXPIREAT): visibility is decided by that clock (an object past its expiry is gone for every
// reader at once, whether Redis has freed its keys yet or not), so Redis's clock never has to
// agree with the replicas' for a key to outlive its object by no more than the clock's offset.
//
// # Atomicity
//
// Every change that touches more than one key, or must check before it writes, is one Lua script
// (a file of lua/): creating a container or a file (create-if-absent), UpdateContainer (the
// Version check), reserving an upload's place and each of its chunks (the owner's quota, the bytes
// in flight), committing an upload (id, quota and bytes decided together), claims, reserving a
// container's place (the scripts that write a record move its place with it), taking a token.
// Scripts run one at a time in Redis, so of several replicas racing for one thing exactly one wins.
//
// # File bytes
//
// File bytes live in Redis too, in chunks of ChunkSize (1 MiB) stored as the fields of one hash
// per file. The replicas share nothing but Redis, and an operator who runs it for them then has no
// other service to provide, secure and keep consistent with the metadata (a shared volume or an
// object store would be a second source of truth, with its own orphans after a crash). Chunks,
// because a single 512 MB value would hold Redis's one thread for the whole copy and reach its
// default bulk limit; one hash, because its chunks then share one TTL, are committed by one RENAME
// and freed by one UNLINK. An upload streams: each chunk is reserved (store.Files) and written as
// soon as it is full, with the upload's TTL refreshed, by one script, so at most one chunk per
// upload is in the proxy's memory, no byte reaches Redis past the owner's quota or the bytes in
// flight allowed, and a cut upload leaves only keys that expire. A reader fetches one chunk at a
// time. The cost is Redis memory: every stored byte is in RAM (and in its persistence files),
// so Redis must be sized for max_file_storage_per_key times the callers, and run with
// maxmemory-policy noeviction, as any Redis holding state must.
package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/ciproxy/ciproxy/internal/store"
)

// Defaults of Options.
const (
	DefaultPrefix      = "ciproxy:"
	DefaultAddr        = "localhost:6379"
	DefaultDialTimeout = 2 * time.Second
	DefaultTimeout     = 2 * time.Second
	DefaultUploadTTL   = time.Hour
	DefaultReadGrace   = 5 * time.Minute
	DefaultChunkSize   = 1 << 20
)

// idClockTTL is how long the id clock outlives the last id minted: far longer than it can run
// ahead of the real clock, so that losing it never lets an id sort before an earlier one.
const idClockTTL = 24 * time.Hour

// Options configure Open. Zero fields take the defaults above.
type Options struct {
	// URL is a redis:// or rediss:// URL (LiteLLM's redis_url). When set it gives the address,
	// the database and, if it holds them, the credentials; Username and Password then fill in
	// only what it leaves out, and Addr and DB are ignored.
	URL string
	// Addr is host:port (LiteLLM's redis_host and redis_port); DefaultAddr when empty.
	Addr     string
	Username string
	Password string
	DB       int

	// Prefix begins every key, so that several deployments can share one Redis.
	Prefix string
	// Now is the clock that decides expiry and stamps ids. Nil: time.Now.
	Now func() time.Time
	// DialTimeout bounds connecting to Redis; Timeout bounds each command's reads and writes.
	// A Redis that is gone or does not answer fails calls within them (ErrUnavailable). A
	// context's deadline shortens them; a cancelled context stops a call before each command
	// (and an upload between chunks), while a command already sent ends within Timeout.
	DialTimeout time.Duration
	Timeout     time.Duration
	// UploadTTL is how long the bytes of an upload in progress live after its last chunk: what
	// an upload cut by a crash leaves behind is gone after it.
	UploadTTL time.Duration
	// ReadGrace is how long the bytes of a deleted file stay for the readers that opened it
	// before (each chunk read extends it).
	ReadGrace time.Duration
	// ChunkSize is the size of the chunks file bytes are stored in. Readers take chunks as they
	// are, so replicas may differ in it.
	ChunkSize int
}

// Store is the Redis store. It is safe for concurrent use.
type Store struct {
	rdb       *redis.Client
	lua       *scripts
	prefix    string
	now       func() time.Time
	ids       *store.IDGenerator // the fallback when Redis cannot mint; also observes every id
	uploadTTL time.Duration
	readGrace time.Duration
	chunkSize int
	chunks    sync.Pool // *[]byte of chunkSize, reused by uploads
	closed    atomic.Bool
}

var _ store.Store = (*Store)(nil)

// Open connects to Redis and checks that it answers and can run the store (version 7.0 or later,
// not a cluster). An unreachable Redis is an error wrapping store.ErrUnavailable.
func Open(ctx context.Context, opts Options) (*Store, error) {
	ro, err := clientOptions(opts)
	if err != nil {
		return nil, err
	}
	lua, err := loadScripts()
	if err != nil {
		return nil, err
	}
	s := &Store{
		rdb:       redis.NewClient(ro),
		lua:       lua,
		prefix:    opts.Prefix,
		now:       opts.Now,
		uploadTTL: opts.UploadTTL,
		readGrace: opts.ReadGrace,
		chunkSize: opts.ChunkSize,
	}
	if s.prefix == "" {
		s.prefix = DefaultPrefix
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.uploadTTL <= 0 {
		s.uploadTTL = DefaultUploadTTL
	}
	if s.readGrace <= 0 {
		s.readGrace = DefaultReadGrace
	}
	if s.chunkSize <= 0 {
		s.chunkSize = DefaultChunkSize
	}
	s.ids = store.NewIDGenerator(s.now)
	s.chunks.New = func() any { b := make([]byte, s.chunkSize); return &b }
	if err := s.check(ctx, ro.Addr); err != nil {
		_ = s.rdb.Close()
		return nil, err
	}
	return s, nil
}

func clientOptions(opts Options) (*redis.Options, error) {
	ro := &redis.Options{Addr: opts.Addr, Username: opts.Username, Password: opts.Password, DB: opts.DB}
	if opts.URL != "" {
		// url.Parse's errors quote the URL, password included: keep only their reason.
		if _, err := url.Parse(opts.URL); err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return nil, fmt.Errorf("redis store: the Redis URL does not parse: %w", err)
		}
		var err error
		if ro, err = redis.ParseURL(opts.URL); err != nil {
			return nil, fmt.Errorf("redis store: the Redis URL: %w", err)
		}
		if ro.Username == "" {
			ro.Username = opts.Username
		}
		if ro.Password == "" {
			ro.Password = opts.Password
		}
	}
	if ro.Addr == "" {
		ro.Addr = DefaultAddr
	}
	ro.DialTimeout = opts.DialTimeout
	if ro.DialTimeout <= 0 {
		ro.DialTimeout = DefaultDialTimeout
	}
	ro.ReadTimeout = opts.Timeout
	if ro.ReadTimeout <= 0 {
		ro.ReadTimeout = DefaultTimeout
	}
	ro.WriteTimeout = ro.ReadTimeout
	ro.PoolTimeout = ro.ReadTimeout
	// No retries: most calls are scripts that must not run twice (a create that ran once and lost
	// its reply would be retried into ErrExists), and a caller can tell ErrUnavailable to retry.
	// One dial per attempt: a Redis that refuses is reported at once, not after backoffs.
	ro.MaxRetries = -1
	ro.DialerRetries = 1
	ro.ContextTimeoutEnabled = true
	ro.DisableIdentity = true
	ro.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return ro, nil
}

// check pings Redis and reads what it is.
func (s *Store) check(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, s.rdb.Options().DialTimeout+s.rdb.Options().ReadTimeout)
	defer cancel()
	info, err := s.rdb.Info(ctx, "server", "cluster").Result()
	if err != nil {
		return fmt.Errorf("redis store: cannot use Redis at %s: %w", addr, s.fail(ctx, err))
	}
	fields := map[string]string{}
	for line := range strings.SplitSeq(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	if fields["cluster_enabled"] == "1" {
		return fmt.Errorf("redis store: %s is a Redis Cluster, which the store does not support (its scripts span many keys)", addr)
	}
	version := fields["redis_version"]
	major, _, _ := strings.Cut(version, ".")
	if n, err := strconv.Atoi(major); err != nil || n < 7 {
		return fmt.Errorf("redis store: %s runs Redis %q; the store needs 7.0 or later", addr, version)
	}
	return nil
}

// Close closes the connections. Calls after Close fail with store.ErrClosed.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if err := s.rdb.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
		return fmt.Errorf("redis store: %w", err)
	}
	return nil
}

// Ping reports whether Redis answers now (for a readiness check): nil, or an error wrapping
// store.ErrUnavailable (store.ErrClosed after Close).
func (s *Store) Ping(ctx context.Context) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	return s.fail(ctx, s.rdb.Ping(ctx).Err())
}

func (s *Store) checkOpen() error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	return nil
}

// fail turns an error of the Redis client into the store's: the caller's own cancellation stays
// what it is, a closed store is ErrClosed, and anything that says Redis cannot serve now (a
// network error, a timeout, a server loading, read-only, out of memory or busy) wraps
// ErrUnavailable. Other error replies are bugs or misconfiguration and are returned as they are.
func (s *Store) fail(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("redis store: %w", ctxErr)
	}
	if s.closed.Load() {
		return store.ErrClosed
	}
	var reply redis.Error
	if errors.As(err, &reply) && !isTransientReply(err) {
		return fmt.Errorf("redis store: %w", err)
	}
	return fmt.Errorf("%w: redis: %w", store.ErrUnavailable, err)
}

// isTransientReply reports whether an error reply says that Redis cannot serve now but may later.
func isTransientReply(err error) bool {
	msg := err.Error()
	for _, p := range []string{"LOADING", "READONLY", "MASTERDOWN", "BUSY", "OOM", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS", "MISCONF"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// SharedSecret returns the secret the replicas of one deployment share when their configuration
// names none (general_settings.container_secret): the first replica to ask creates it (SET NX of
// 32 random bytes), and every replica, that one included, gets what Redis holds. Everyone who can
// reach this Redis can read it, as they can read and change all the state it keeps. It lives until
// it is deleted (docs/replicas.md: rotation).
func (s *Store) SharedSecret(ctx context.Context) (string, error) {
	if err := s.checkOpen(); err != nil {
		return "", err
	}
	mine := randomHex(32)
	prev, err := s.rdb.SetArgs(ctx, s.key("secret"), mine, redis.SetArgs{Mode: "NX", Get: true}).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return mine, nil // there was none: this one is set
	case err != nil:
		return "", fmt.Errorf("redis store: the shared secret: %w", s.fail(ctx, err))
	case prev == "":
		return "", errors.New("redis store: the shared secret in Redis is empty; delete the key so that the replicas agree on a new one")
	}
	return prev, nil
}

// NewID implements [store.Store.NewID]. The millisecond of each id comes from one counter in
// Redis (idclock), moved by every replica, so ids sort in the order they were minted across all
// of them, not only within one process: the counter never goes back, and a replica whose clock
// runs behind mints after the last id anyway. When Redis cannot be reached the id comes from this
// process's generator, which has seen every id minted through it.
func (s *Store) NewID(k store.Kind) string {
	if s.checkOpen() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), s.rdb.Options().ReadTimeout)
		defer cancel()
		ms, err := s.lua.mint.Run(ctx, s.rdb, []string{s.key("idclock")},
			s.prefix, s.nowMs(), idClockTTL.Milliseconds()).Int64()
		if err == nil {
			id := store.NewIDGenerator(func() time.Time { return time.UnixMilli(ms) }).New(k)
			s.ids.Observe(k, id)
			return id
		}
	}
	return s.ids.New(k)
}

// key is name under the prefix.
func (s *Store) key(parts ...string) string {
	return s.prefix + strings.Join(parts, ":")
}

// ownerKey is the key of one of owner's indexes ("cntrs", "files").
func (s *Store) ownerKey(owner, index string) string {
	return s.key("owner", escapeOwner(owner), index)
}

// ownerEscaper percent-encodes '%' and ':'. A Replacer is immutable once built (and building one
// costs kilobytes, which a call per key would pay).
var ownerEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

// escapeOwner percent-encodes '%' and ':', so that an owner is one key element.
func escapeOwner(owner string) string {
	if !strings.ContainsAny(owner, "%:") {
		return owner
	}
	return ownerEscaper.Replace(owner)
}

// nowMs is the store's clock in milliseconds, rounded down.
func (s *Store) nowMs() int64 { return s.now().UnixMilli() }

// atMs is an expiry in milliseconds, rounded up, or 0 for none: an object expires once
// nowMs >= atMs, the same test in Go and in the scripts, and never before its expiry.
func atMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	ms := t.UnixMilli()
	if t.After(time.UnixMilli(ms)) {
		ms++
	}
	return max(ms, 1)
}

func expiredMs(at, now int64) bool { return at != 0 && at <= now }

// ttl is how long a key must live for an object expiring at at (ms, 0: never); 0 means no TTL.
func ttl(at, now int64) time.Duration {
	if at == 0 {
		return 0
	}
	return time.Duration(max(at-now, 1)) * time.Millisecond
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// status reads a script's reply: an array whose first element says what happened.
func status(v any) (string, []any, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) == 0 {
		return "", nil, fmt.Errorf("redis store: unexpected script reply %T", v)
	}
	st, ok := arr[0].(string)
	if !ok {
		return "", nil, fmt.Errorf("redis store: unexpected script status %T", arr[0])
	}
	return st, arr[1:], nil
}

// str is the string of a reply element ("" for nil).
func str(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case int64:
		return strconv.FormatInt(v, 10)
	}
	return ""
}
