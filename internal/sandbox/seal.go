package sandbox

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// ContainerIDPrefix starts every container id, as OpenAI's do.
const ContainerIDPrefix = "cntr_"

// KeySize is the length of a sealing key (AES-256).
const KeySize = 32

// Token is what a container id carries.
type Token struct {
	// Handle reaches the sandbox.
	Handle Handle `json:"h"`
	// Owner is the hash of the caller's key that created the container ("" for an open proxy).
	Owner string `json:"o,omitempty"`
	// Expires is the container's hard end of life, fixed at creation (see Sessions). An id past it
	// does not open.
	Expires time.Time `json:"-"`
}

// tokenWire is Token's compact sealed form: expiry as unix seconds.
type tokenWire struct {
	Handle  Handle `json:"h"`
	Owner   string `json:"o,omitempty"`
	Expires int64  `json:"e"`
}

// Sealer turns Tokens into opaque container ids and back. It is safe for concurrent use.
//
// An id is "cntr_" + base64url(nonce || AES-256-GCM(payload)), payload being the Token's compact JSON;
// the prefix is authenticated as additional data. Anyone with the key can open an id; nobody without
// it can read or forge one.
type Sealer struct {
	aead cipher.AEAD
}

// NewSealer returns a Sealer under key, which must be KeySize bytes. A nil or empty key means a
// random key: ids then open only in this process.
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) == 0 {
		key = make([]byte, KeySize)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("sandbox: random sealing key: %w", err)
		}
	}
	if len(key) != KeySize {
		return nil, fmt.Errorf("sandbox: sealing key is %d bytes, want %d", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("sandbox: sealing key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("sandbox: sealing key: %w", err)
	}
	return &Sealer{aead: aead}, nil
}

// KeyFromSecret derives a sealing key from a configured secret of any length (general_settings'
// container_secret), so that every replica configured with the same secret opens the same ids.
func KeyFromSecret(secret string) []byte {
	sum := sha256.Sum256([]byte("ciproxy container id key v1\x00" + secret))
	return sum[:]
}

// Seal returns the container id for t.
func (s *Sealer) Seal(t Token) string {
	payload, err := json.Marshal(tokenWire{Handle: t.Handle, Owner: t.Owner, Expires: t.Expires.Unix()})
	if err != nil {
		// Only strings and an int: cannot fail.
		panic(fmt.Sprintf("sandbox: marshal token: %v", err))
	}
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(payload)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		panic(fmt.Sprintf("sandbox: random nonce: %v", err)) // crypto/rand does not fail on Linux
	}
	sealed := s.aead.Seal(nonce, nonce, payload, []byte(ContainerIDPrefix))
	return ContainerIDPrefix + base64.RawURLEncoding.EncodeToString(sealed)
}

// errBadID is what every failed Open wraps, whatever the reason: an id's holder learns nothing more.
var errBadID = fmt.Errorf("%w: unknown container id", ErrNotFound)

// Open returns the Token sealed in id. Anything that does not decode, authenticate and parse is
// ErrNotFound. Expiry is not checked here (see OpenAt).
func (s *Sealer) Open(id string) (Token, error) {
	rest, ok := strings.CutPrefix(id, ContainerIDPrefix)
	if !ok {
		return Token{}, errBadID
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	if err != nil || len(raw) < s.aead.NonceSize()+s.aead.Overhead() {
		return Token{}, errBadID
	}
	ns := s.aead.NonceSize()
	payload, err := s.aead.Open(nil, raw[:ns], raw[ns:], []byte(ContainerIDPrefix))
	if err != nil {
		return Token{}, errBadID
	}
	var w tokenWire
	if err := json.Unmarshal(payload, &w); err != nil || w.Handle.ID == "" || w.Handle.Tool == "" {
		return Token{}, errBadID
	}
	return Token{Handle: w.Handle, Owner: w.Owner, Expires: time.Unix(w.Expires, 0)}, nil
}

// OpenAt is Open that also rejects a token expired at now, with ErrNotFound.
func (s *Sealer) OpenAt(id string, now time.Time) (Token, error) {
	t, err := s.Open(id)
	if err != nil {
		return Token{}, err
	}
	if !now.Before(t.Expires) {
		return Token{}, fmt.Errorf("%w: container expired", ErrNotFound)
	}
	return t, nil
}
