// Package store is the state the proxy keeps between requests: stored responses, the container
// registry with each container's files, the Files API's files (metadata and bytes), short claims
// that decide which process does a piece of work, and what the container quotas count (places,
// token buckets), so that every process sharing a store applies them together. Store is the one
// interface; the embedded implementation (package embedded) keeps everything on local disk for
// one process, and a shared implementation lets several replicas serve the same conversations.
// Package storetest holds the conformance suite that every implementation passes.
//
// Every read is scoped: an object that belongs to another owner is ErrNotFound, exactly as one that
// does not exist. Objects carry their own expiry (ExpiresAt, ForgetAt): past it they are gone for
// every reader at once, and an implementation frees them (keys expire, files are deleted) on its
// own schedule.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"time"
)

// Errors. Implementations wrap them with %w; callers test with errors.Is.
var (
	// ErrNotFound: the object does not exist, has expired, or belongs to another owner.
	ErrNotFound = errors.New("store: not found")
	// ErrExists: an object with that id or key already exists (create-if-absent lost).
	ErrExists = errors.New("store: already exists")
	// ErrConflict: the object changed since it was read (its Version moved on).
	ErrConflict = errors.New("store: changed since it was read")
	// ErrTooLarge: a file is larger than FileLimits.MaxBytes. Nothing was stored.
	ErrTooLarge = errors.New("store: file too large")
	// ErrQuota: storing a file would take its owner past FileLimits.OwnerBytes. Nothing was stored.
	ErrQuota = errors.New("store: owner's storage quota exceeded")
	// ErrTooManyUploads: the owner has FileLimits.MaxUploads uploads in flight already. Nothing
	// was stored.
	ErrTooManyUploads = errors.New("store: too many uploads in flight for the owner")
	// ErrInFlightFull: the uploads in flight would together hold more than
	// FileLimits.MaxInFlight bytes. Nothing was stored.
	ErrInFlightFull = errors.New("store: the bytes of the uploads in flight are at their limit")
	// ErrInvalid: an argument is malformed (an id or cursor of the wrong shape, a record that
	// cannot be encoded).
	ErrInvalid = errors.New("store: invalid argument")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("store: closed")
	// ErrUnavailable: the store's backing service cannot be reached; the operation may succeed
	// later. The embedded store never returns it.
	ErrUnavailable = errors.New("store: unavailable")
)

// Store is all the state, behind one interface. Implementations are safe for concurrent use.
type Store interface {
	// NewID mints a fresh id of kind k. Ids minted by one Store sort in the order they were minted
	// (see Kind), which is what list cursors rely on.
	NewID(k Kind) string

	Responses
	Containers
	ContainerFiles
	Files
	Claims
	Quotas

	// Close releases the store. Calls after Close fail with ErrClosed; an upload in progress can
	// only be aborted.
	Close() error
}

// Order is the direction of a list: by creation, newest first (Desc, the default) or oldest first.
type Order string

const (
	Desc Order = "desc"
	Asc  Order = "asc"
)

// Page selects a slice of a list ordered by creation.
type Page struct {
	// After is a cursor: the id of an object of the listed kind. The list holds only the objects
	// that come after it in Order; the object itself need not exist any more. "" starts at the
	// beginning. An After that is not an id of the listed kind is ErrInvalid.
	After string
	// Limit is the most objects returned; <= 0 means no limit.
	Limit int
	// Order is Desc when empty.
	Order Order
}

// List is one page of a list.
type List[T any] struct {
	Items []T
	// HasMore reports that more objects follow the last one in Items.
	HasMore bool
}

// Responses remembers what the proxy needs to continue a conversation it intercepted: which
// upstream response a client-visible response id stands for, its container, the calls it minted,
// and what the client received.
//
// Unlike every other read here, Response and Call are not scoped by owner: the caller must tell a
// response id this proxy never minted (which passes through to the upstream) from one minted for
// another caller (a 404), so it gets the record and compares Owner itself.
type Responses interface {
	// PutResponse stores r and its calls, replacing a response with the same id. Ids are 1 to 128
	// letters, digits, '_' or '-' (ErrInvalid otherwise); the JSON fields must hold valid JSON.
	PutResponse(ctx context.Context, r Response, calls []Call) error
	// Response returns the response stored under id.
	Response(ctx context.Context, id string) (Response, error)
	// Call returns the code_interpreter_call ("ci_...") or shell item ("sh_...", "sho_...")
	// stored under id.
	Call(ctx context.Context, id string) (Call, error)
	// DeleteResponse forgets a response; its calls stay, so a stateless client can still replay
	// them. Deleting what does not exist is not an error.
	DeleteResponse(ctx context.Context, id string) error
}

// Response is what a client-visible response id maps to. Its JSON form is how every
// implementation persists it; the JSON the client received (Body, Input) is kept as it is.
type Response struct {
	ID    string `json:"id"`
	Owner string `json:"owner"`
	// UpstreamID is the id of the last upstream response of the loop.
	UpstreamID string `json:"upstream_id,omitempty"`
	// ContainerID is the cntr_ id of the container the response used ("" if none).
	ContainerID string `json:"container_id,omitempty"`
	// Pending holds function_call_output items owed to the upstream when the conversation
	// continues from UpstreamID.
	Pending []json.RawMessage `json:"pending,omitempty"`
	// Body is the final Response as the client received it (store: true); nil when not kept.
	Body json.RawMessage `json:"body,omitempty"`
	// Input is the JSON array of the response's input items, for input_items; nil when not kept.
	Input     json.RawMessage `json:"input,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	// ExpiresAt is when the response is forgotten; zero means never.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// Call is what the upstream saw of one code execution. Its JSON form is how every implementation
// persists it.
type Call struct {
	ID     string `json:"id"` // the code_interpreter_call item id
	Owner  string `json:"owner"`
	CallID string `json:"call_id"` // the upstream's call_id
	// ContainerID is the cntr_ id of the container the code ran in ("" if unknown).
	ContainerID string `json:"container_id,omitempty"`
	Code        string `json:"code"`
	Output      string `json:"output"` // the function_call_output text the model was given
	// Item is, for a shell item the proxy minted (a shell_call "sh_..." or a shell_call_output
	// "sho_..."), the item as the client received it, in JSON; "" for a code_interpreter_call.
	Item string `json:"item,omitempty"`
	// ExpiresAt is when the call is forgotten; zero means never.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// Containers is the container registry: what a cntr_ id stands for.
type Containers interface {
	// CreateContainer stores c as a new container. An empty ID is minted; an ID already taken is
	// ErrExists (create-if-absent). The stored record is returned with Version 1.
	CreateContainer(ctx context.Context, c Container) (Container, error)
	// Container returns owner's container id.
	Container(ctx context.Context, owner, id string) (Container, error)
	// UpdateContainer replaces the stored container with c if the stored Version still equals
	// c.Version (ErrConflict otherwise) and returns it with Version incremented. ID, Owner and
	// CreatedAt cannot change. See Modify for a read-modify-write loop.
	UpdateContainer(ctx context.Context, c Container) (Container, error)
	// DeleteContainer removes owner's container id and its files.
	DeleteContainer(ctx context.Context, owner, id string) error
	// ListContainers lists owner's containers by creation.
	ListContainers(ctx context.Context, owner string, q ContainerQuery) (List[Container], error)
	// ExpiringContainers returns up to limit containers of any owner whose ExpiresAt is set and not
	// after before, the earliest first. The janitor uses it; it claims each one by an
	// UpdateContainer that clears ExpiresAt, so that exactly one process acts on it.
	ExpiringContainers(ctx context.Context, before time.Time, limit int) ([]Container, error)
}

// ContainerQuery selects containers.
type ContainerQuery struct {
	Name string // only containers with this name; "" for all
	Page
}

// NetworkPolicy is what is kept of a container's network policy: its type ("disabled" or
// "allowlist") and domains. Secrets are never kept.
type NetworkPolicy struct {
	Type           string   `json:"type"`
	AllowedDomains []string `json:"allowed_domains,omitempty"`
}

// Container is one entry of the container registry. Its JSON form is the record both stores
// keep; the Redis store keeps ID, Owner, CreatedAt and Version in fields of their own, which its
// scripts check, and leaves them out of the JSON (hence omitempty on fields every record has).
type Container struct {
	ID    string `json:"id,omitempty"` // cntr_...
	Owner string `json:"owner,omitempty"`
	Name  string `json:"name,omitempty"`
	// Backend and Tool say which sandbox provider runs it ("local" or "e2b", and the
	// sandbox_tool_name).
	Backend string `json:"backend,omitempty"`
	Tool    string `json:"tool,omitempty"`
	// Handle is the sandbox handle as the backend encoded it; nil while the sandbox is being
	// created. It may hold the sandbox's access token, so it never leaves the proxy.
	Handle []byte `json:"handle,omitempty"`
	// Host is the replica that hosts a local sandbox ("" when any replica can reach it).
	Host        string `json:"host,omitempty"`
	MemoryLimit string `json:"memory_limit,omitempty"`
	// Network is the container's network_policy as the Containers API shows it (never its
	// secrets); nil when none was set.
	Network *NetworkPolicy `json:"network_policy,omitempty"`
	// Status is the caller's: "running", "expired", ... The store does not interpret it.
	Status       string        `json:"status,omitempty"`
	IdleTimeout  time.Duration `json:"idle_timeout_ns,omitempty"`
	CreatedAt    time.Time     `json:"created_at,omitzero"`
	LastActiveAt time.Time     `json:"last_active_at,omitzero"`
	// ExpiresAt is when the sandbox expires unless used again (the caller keeps it at
	// LastActiveAt + IdleTimeout); zero: no expiry pending. ExpiringContainers lists by it.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// ForgetAt is when the store deletes the record and its files; zero means never.
	ForgetAt time.Time `json:"forget_at,omitzero"`
	// Version counts the record's changes; the store sets it.
	Version int64 `json:"version,omitempty"`
}

// ContainerFiles are the files a container holds (cfile_ ids). Their bytes live in the container;
// these records say what is there.
type ContainerFiles interface {
	// PutContainerFile stores f, replacing the file with the same ID; an empty ID is minted. The
	// container f.ContainerID must exist and belong to f.Owner (ErrNotFound otherwise).
	PutContainerFile(ctx context.Context, f ContainerFile) (ContainerFile, error)
	// ContainerFile returns file id of owner's container containerID.
	ContainerFile(ctx context.Context, owner, containerID, id string) (ContainerFile, error)
	// ListContainerFiles lists the files of owner's container containerID by creation.
	ListContainerFiles(ctx context.Context, owner, containerID string, q ContainerFileQuery) (List[ContainerFile], error)
	// DeleteContainerFile removes file id of owner's container containerID.
	DeleteContainerFile(ctx context.Context, owner, containerID, id string) error
}

// ContainerFileQuery selects container files.
type ContainerFileQuery struct {
	Path string // only the file at this path; "" for all
	Page
}

// ContainerFile is one file in a container. Its JSON form is the record both stores keep.
type ContainerFile struct {
	ID          string    `json:"id"` // cfile_...
	ContainerID string    `json:"container_id"`
	Owner       string    `json:"owner"`
	Path        string    `json:"path"` // absolute, under /mnt/data
	Bytes       int64     `json:"bytes"`
	Source      string    `json:"source"` // "user" or "assistant"
	CreatedAt   time.Time `json:"created_at"`
	// Origin names what a placed file was copied from, so that placing it again in the same
	// container finds it: "file:" and a Files API id, or "data:" and a digest of inline bytes
	// and their name. "" for a file uploaded to the container or made by its code.
	Origin string `json:"origin,omitempty"`
}

// Files are the Files API's files: metadata and bytes.
//
// An upload in flight (begun, neither committed nor aborted) holds a reservation: one of its
// owner's FileLimits.MaxUploads, and every byte it has written, which counts against its owner's
// FileLimits.OwnerBytes beside the owner's files and against FileLimits.MaxInFlight beside every
// other upload in flight. Bytes are reserved before they are stored, so an owner's files and
// uploads together never hold more than OwnerBytes, on disk or in the store's service, at any
// moment. Commit turns the reservation into the file; Abort frees it. The reservation of an
// upload whose process died is not kept forever: it goes with the process (the embedded store)
// or expires with the upload's stored bytes (a shared store; see its UploadTTL).
type Files interface {
	// BeginFile starts storing a file for owner under lim: ErrTooManyUploads when the owner has
	// lim.MaxUploads uploads in flight, ErrQuota when the owner's files and uploads already hold
	// lim.OwnerBytes, ErrInFlightFull when the uploads in flight hold lim.MaxInFlight bytes.
	// Nothing is visible until FileUpload.Commit succeeds.
	BeginFile(ctx context.Context, owner string, lim FileLimits) (FileUpload, error)
	// File returns owner's file id.
	File(ctx context.Context, owner, id string) (File, error)
	// OpenFile returns owner's file id and a reader of its bytes, which the caller closes. The
	// reader yields the bytes committed, even if the file is deleted meanwhile.
	OpenFile(ctx context.Context, owner, id string) (File, io.ReadCloser, error)
	// ListFiles lists owner's files by creation.
	ListFiles(ctx context.Context, owner string, q FileQuery) (List[File], error)
	// DeleteFile removes owner's file id and returns what it was.
	DeleteFile(ctx context.Context, owner, id string) (File, error)
	// Usage reports what owner's files take (committed files only, not uploads in flight).
	Usage(ctx context.Context, owner string) (Usage, error)
}

// FileLimits bound one upload. Zero fields mean no limit.
type FileLimits struct {
	// MaxBytes is the largest file accepted.
	MaxBytes int64
	// OwnerBytes is the most the owner's files and uploads in flight may hold together, this one
	// included.
	OwnerBytes int64
	// MaxUploads is the most uploads the owner may have in flight at once, this one included.
	MaxUploads int
	// MaxInFlight is the most bytes the uploads in flight of every owner may hold together: of
	// the process for a store only one process opens, of every process sharing it otherwise.
	MaxInFlight int64
}

// FileUpload is a file being stored. It is used by one goroutine.
type FileUpload interface {
	// Write appends everything r yields, reserving each byte before it is stored (see Files).
	// Past FileLimits.MaxBytes it fails with ErrTooLarge, past what the owner has left with
	// ErrQuota, past what the uploads in flight may hold with ErrInFlightFull; the upload can
	// then only be aborted. When Write returns, every byte it took is reserved.
	Write(ctx context.Context, r io.Reader) (int64, error)
	// Commit makes the file visible with the bytes written. f.ID, when empty, is minted (a taken
	// ID is ErrExists); Owner and Bytes are set from the upload. The quota is checked again, with
	// everything committed meanwhile. After a failed Commit nothing is stored. Either way the
	// upload's reservation is gone.
	Commit(ctx context.Context, f File) (File, error)
	// Abort discards the upload and frees its reservation. It does nothing after a successful
	// Commit and may be called more than once, so callers defer it.
	Abort() error
}

// FileQuery selects files.
type FileQuery struct {
	Purpose string // only files with this purpose; "" for all
	Page
}

// File is one Files API file.
type File struct {
	ID        string    `json:"id"` // file-...
	Owner     string    `json:"owner"`
	Filename  string    `json:"filename"`
	Purpose   string    `json:"purpose"`
	Bytes     int64     `json:"bytes"`
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt is when the file is deleted; zero means never.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// Expired reports whether f has expired by now.
func (f File) Expired(now time.Time) bool { return !f.ExpiresAt.IsZero() && !now.Before(f.ExpiresAt) }

// Usage is what an owner's files take.
type Usage struct {
	Files int
	Bytes int64
}

// Claims are short leases that decide which process does a piece of work (create a container for
// a conversation, delete an expired one).
type Claims interface {
	// Claim makes holder the holder of key for ttl, if no one else holds it: create-if-absent. It
	// reports whether holder holds key now; a holder that claims again extends its lease.
	Claim(ctx context.Context, key, holder string, ttl time.Duration) (bool, error)
	// Release ends holder's claim on key. A claim held by someone else is left alone.
	Release(ctx context.Context, key, holder string) error
	// Holder returns who holds key now, "" when no one does. It changes nothing.
	Holder(ctx context.Context, key string) (string, error)
}

// Quotas count what the container quotas limit, for every process that shares the store: the
// places an owner's containers take, the places the deployment's shared containers take, and
// token buckets that meter how fast containers are created.
//
// A place is held by a live container, whatever process created or opened it: a record whose
// ExpiresAt is set and not yet passed (nor its ForgetAt) holds its owner's place until then, and
// also a shared place when its Host is "" (any replica reaches its sandbox, as e2b's).
// CreateContainer and UpdateContainer move the place with the record, atomically with it; an
// update that clears ExpiresAt (a container claimed as expired), DeleteContainer, or the record
// being forgotten frees it. Between the quota check and the record, a container's place is held
// by a reservation, which runs out at its TTL if the record is never written (its process died).
// Places are identified by container id, so nothing is ever counted twice or freed twice.
type Quotas interface {
	// ReservePlace reserves a place for container id of r.Owner, about to be created, until r.TTL
	// from now, unless the owner already holds r.MaxPerOwner places or (r.Shared) the deployment
	// holds r.MaxShared shared places; a limit <= 0 is none. A container that already holds a
	// place keeps it (its reservation extended), whatever the limits.
	ReservePlace(ctx context.Context, r PlaceRequest) (Places, error)
	// CancelPlace frees the reservation of owner's container id, unless its record exists: for a
	// container whose creation failed.
	CancelPlace(ctx context.Context, owner, id string) error
	// Places reports the places owner holds now, and the shared places of the deployment.
	Places(ctx context.Context, owner string) (Places, error)
	// TakeToken takes one token from the bucket named key, which holds up to b.Burst tokens and
	// gains b.PerMinute a minute; a new bucket is full. It reports whether a token was taken, and
	// if not, how long until one will be there. A full bucket is not kept.
	TakeToken(ctx context.Context, key string, b Bucket) (taken bool, wait time.Duration, err error)
}

// PlaceRequest asks for a container's place (Quotas.ReservePlace).
type PlaceRequest struct {
	Owner, ID string
	// Shared: the container will be reachable from every replica (its record's Host will be "").
	Shared bool
	// MaxPerOwner and MaxShared bound the places; <= 0: no bound.
	MaxPerOwner, MaxShared int
	// TTL is how long the reservation holds without a record.
	TTL time.Duration
}

// Places is what ReservePlace found or left.
type Places struct {
	// Owner and Shared count the owner's places and the deployment's shared places, the one
	// reserved included (Shared only when asked for: ReservePlace with Shared, or Places).
	Owner, Shared int
	// Refused names the bound that refused the reservation: "" (reserved), RefusedOwner or
	// RefusedShared. Nothing was reserved when it is set.
	Refused string
}

// Places.Refused values.
const (
	RefusedOwner  = "owner"
	RefusedShared = "shared"
)

// Bucket is a token bucket's rate and size (Quotas.TakeToken). PerMinute must be positive; a
// Burst below 1 is 1.
type Bucket struct {
	PerMinute, Burst int
}

// PlaceUntil is until when record c holds a place: its ExpiresAt, or its ForgetAt if that comes
// first; zero when it holds none.
func PlaceUntil(c Container) time.Time {
	if !c.ForgetAt.IsZero() && c.ForgetAt.Before(c.ExpiresAt) {
		return c.ForgetAt
	}
	return c.ExpiresAt
}
