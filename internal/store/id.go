package store

import (
	"crypto/rand"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Kind is a kind of id. Every id is a prefix, a fixed-width creation time in milliseconds, then
// random characters; all ids of a kind have the same length and alphabet, so comparing two ids as
// strings compares their creation times. List cursors rely on that: the objects after a cursor are
// the ids greater (or smaller) than it, whether or not the cursor's own object still exists.
//
// The shapes follow OpenAI's: file- and 22 letters or digits; cntr_ and 48 hex digits; cfile_ and
// 32 hex digits. OpenAI's own container ids also begin with their creation time in hex.
type Kind int

const (
	FileKind          Kind = iota // file-<8 base62 time><14 base62 random>
	ContainerKind                 // cntr_<12 hex time><36 hex random>
	ContainerFileKind             // cfile_<12 hex time><20 hex random>
)

type idShape struct {
	prefix     string
	alphabet   string // in ASCII order, so that string order is numeric order
	timeDigits int
	randDigits int
}

const (
	base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	hexLow = "0123456789abcdef"
)

func (k Kind) shape() idShape {
	switch k {
	case FileKind:
		return idShape{"file-", base62, 8, 14}
	case ContainerKind:
		return idShape{"cntr_", hexLow, 12, 36}
	case ContainerFileKind:
		return idShape{"cfile_", hexLow, 12, 20}
	}
	panic("store: unknown id kind")
}

// Prefix is the kind's prefix ("file-", "cntr_", "cfile_").
func (k Kind) Prefix() string { return k.shape().prefix }

// Valid reports whether id has the shape of an id of kind k. It says nothing about whether the
// object exists.
func (k Kind) Valid(id string) bool {
	s := k.shape()
	body, ok := strings.CutPrefix(id, s.prefix)
	if !ok || len(body) != s.timeDigits+s.randDigits {
		return false
	}
	for i := 0; i < len(body); i++ {
		if strings.IndexByte(s.alphabet, body[i]) < 0 {
			return false
		}
	}
	return true
}

// IDGenerator mints ids. The time part of each id it mints is strictly greater than the previous
// one's (a burst within one millisecond borrows the next milliseconds), so its ids sort in the
// order they were minted. It is safe for concurrent use.
type IDGenerator struct {
	now  func() time.Time
	mu   sync.Mutex
	last int64 // milliseconds of the last id minted
}

// NewIDGenerator returns a generator reading the clock now (nil: time.Now).
func NewIDGenerator(now func() time.Time) *IDGenerator {
	if now == nil {
		now = time.Now
	}
	return &IDGenerator{now: now}
}

// New mints an id of kind k.
func (g *IDGenerator) New(k Kind) string {
	s := k.shape()
	g.mu.Lock()
	ms := max(g.now().UnixMilli(), g.last+1, 0)
	g.last = ms
	g.mu.Unlock()

	base := int64(len(s.alphabet))
	b := make([]byte, len(s.prefix)+s.timeDigits+s.randDigits)
	copy(b, s.prefix)
	digits := b[len(s.prefix):]
	for i := s.timeDigits - 1; i >= 0; i-- {
		digits[i] = s.alphabet[ms%base]
		ms /= base
	}
	randomDigits(digits[s.timeDigits:], s.alphabet)
	return string(b)
}

// Observe makes the ids minted from now on sort after id, an id of kind k minted earlier (by
// another generator, or before a restart). Ids of another shape are ignored.
func (g *IDGenerator) Observe(k Kind, id string) {
	if !k.Valid(id) {
		return
	}
	s := k.shape()
	var ms int64
	for _, c := range []byte(id[len(s.prefix) : len(s.prefix)+s.timeDigits]) {
		ms = ms*int64(len(s.alphabet)) + int64(strings.IndexByte(s.alphabet, c))
	}
	g.mu.Lock()
	g.last = max(g.last, ms)
	g.mu.Unlock()
}

// randomDigits fills dst with uniformly random characters of alphabet (at most 256 long).
func randomDigits(dst []byte, alphabet string) {
	// Rejection sampling: bytes at or above the largest multiple of len(alphabet) are drawn again,
	// so that every character is equally likely.
	limit := byte(256 / len(alphabet) * len(alphabet) % 256)
	buf := make([]byte, len(dst)+len(dst)/2+8)
	for n := 0; n < len(dst); {
		_, _ = rand.Read(buf) // crypto/rand.Read never fails
		for _, c := range buf {
			if limit != 0 && c >= limit {
				continue
			}
			dst[n] = alphabet[int(c)%len(alphabet)]
			if n++; n == len(dst) {
				break
			}
		}
	}
}

// safeIDRE is the alphabet of SafeID. The length is checked apart: a counted repetition
// ({1,128}) compiles to 128 copies of the class, 50 kB kept by every process from its start.
var safeIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// SafeID reports whether id is 1 to 128 letters, digits, '_' or '-': the response and call ids
// every store accepts (see Responses). Such an id is never "", "." or "..", a separator or NUL,
// so it can name a file as it is.
func SafeID(id string) bool { return len(id) <= 128 && safeIDRE.MatchString(id) }
