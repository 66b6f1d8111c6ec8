package sandbox

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"
)

func testToken() Token {
	return Token{
		Handle: Handle{Backend: "e2b", Tool: "e2b-tool", ID: "ixyz123abc", AccessToken: "acc-token",
			TrafficToken: "traffic", Domain: "e2b.app"},
		Owner:   "ownerhash0123456789abcdef",
		Expires: time.Unix(1_900_000_000, 0),
	}
}

func mustSealer(t testing.TB, key []byte) *Sealer {
	t.Helper()
	s, err := NewSealer(key)
	if err != nil {
		t.Fatalf("NewSealer() error = %v", err)
	}
	return s
}

func TestSealRoundTrip(t *testing.T) {
	key := bytes.Repeat([]byte{7}, KeySize)
	s := mustSealer(t, key)
	tok := testToken()
	id := s.Seal(tok)
	if !strings.HasPrefix(id, "cntr_") {
		t.Fatalf("Seal() = %q; want a cntr_ prefix", id)
	}
	for _, secret := range []string{"ixyz123abc", "acc-token", "traffic", "ownerhash"} {
		if strings.Contains(id, secret) {
			t.Errorf("Seal() = %q shows %q in clear", id, secret)
		}
	}
	if id2 := s.Seal(tok); id2 == id {
		t.Errorf("Seal() twice gave the same id; want a fresh nonce each time")
	}
	// Another Sealer with the same key (another replica) opens it.
	got, err := mustSealer(t, key).Open(id)
	if err != nil {
		t.Fatalf("Open() error = %v", err)
	}
	if got != tok {
		t.Errorf("Open(Seal(t)) = %+v; want %+v", got, tok)
	}
	if _, err := s.OpenAt(id, tok.Expires.Add(-time.Second)); err != nil {
		t.Errorf("OpenAt(before expiry) error = %v", err)
	}
}

func TestOpenRejects(t *testing.T) {
	key := bytes.Repeat([]byte{1}, KeySize)
	s := mustSealer(t, key)
	tok := testToken()
	id := s.Seal(tok)
	body := id[len("cntr_"):]
	raw, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(raw)
	flipped[len(flipped)/2] ^= 0x01
	flippedNonce := bytes.Clone(raw)
	flippedNonce[0] ^= 0x80

	otherTok := tok
	otherTok.Handle.ID = "other"
	noID := tok
	noID.Handle.ID = ""

	tests := []struct {
		name string
		id   string
		at   time.Time
	}{
		{"flipped ciphertext bit", "cntr_" + base64.RawURLEncoding.EncodeToString(flipped), time.Time{}},
		{"flipped nonce bit", "cntr_" + base64.RawURLEncoding.EncodeToString(flippedNonce), time.Time{}},
		{"truncated by one char", id[:len(id)-1], time.Time{}},
		{"truncated to half", id[:len(id)/2], time.Time{}},
		{"truncated to the nonce", "cntr_" + base64.RawURLEncoding.EncodeToString(raw[:12]), time.Time{}},
		{"no prefix", body, time.Time{}},
		{"other prefix", "resp_" + body, time.Time{}},
		{"uppercase prefix", "CNTR_" + body, time.Time{}},
		{"padding added", id + "=", time.Time{}},
		{"standard base64", "cntr_" + base64.RawStdEncoding.EncodeToString(raw) + "+/", time.Time{}},
		{"different key", mustSealer(t, bytes.Repeat([]byte{2}, KeySize)).Seal(tok), time.Time{}},
		{"random key", mustSealer(t, nil).Seal(otherTok), time.Time{}},
		{"empty", "", time.Time{}},
		{"prefix only", "cntr_", time.Time{}},
		{"openai style id", "cntr_682d1f9a1c8c8191b6b4ba3c8f3d2f2d0a1b2c3d4e5f6a7b", time.Time{}},
		{"expired at its expiry", id, tok.Expires},
		{"expired after", id, tok.Expires.Add(time.Hour)},
		{"authentic but without sandbox id", s.Seal(noID), time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.at.IsZero() {
				_, err = s.Open(tt.id)
			} else {
				_, err = s.OpenAt(tt.id, tt.at)
			}
			if !errors.Is(err, ErrNotFound) {
				t.Errorf("Open(%q) error = %v; want ErrNotFound", tt.id, err)
			}
		})
	}
	t.Run("random strings", func(t *testing.T) {
		for range 1000 {
			b := make([]byte, 1+len(raw)%97)
			rand.Read(b)
			cand := "cntr_" + base64.RawURLEncoding.EncodeToString(b)
			if _, err := s.Open(cand); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Open(%q) error = %v; want ErrNotFound", cand, err)
			}
		}
	})
}

func TestNewSealerKeySize(t *testing.T) {
	for _, n := range []int{1, 16, 31, 33, 64} {
		if _, err := NewSealer(make([]byte, n)); err == nil {
			t.Errorf("NewSealer(%d-byte key) error = nil; want an error", n)
		}
	}
	if k := KeyFromSecret("s3cret"); len(k) != KeySize || bytes.Equal(k, KeyFromSecret("s3cret2")) {
		t.Errorf("KeyFromSecret() = %x; want %d bytes that depend on the secret", k, KeySize)
	}
}

// FuzzOpen mutates a valid id: the result must not open, or open to the very same token (a change
// that base64 decoding ignores cannot exist with the strict decoder, but the property is the point).
func FuzzOpen(f *testing.F) {
	s := mustSealer(f, bytes.Repeat([]byte{9}, KeySize))
	tok := testToken()
	id := s.Seal(tok)
	f.Add(id, 0, byte(1))
	f.Add(id, 5, byte(0x20))
	f.Add(id, len(id)-1, byte(0))
	f.Add("cntr_", 0, byte(0))
	f.Add("garbage", 3, byte(0xff))
	f.Fuzz(func(t *testing.T, base string, pos int, x byte) {
		cand := base
		if base == id && len(base) > 0 {
			// Mutate the valid id at pos: xor a byte, or cut it there when x is 0.
			p := pos % len(base)
			if p < 0 {
				p += len(base)
			}
			if x == 0 {
				cand = base[:p]
			} else {
				b := []byte(base)
				b[p] ^= x
				cand = string(b)
			}
		}
		got, err := s.Open(cand)
		if err != nil {
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("Open(%q) error = %v; want ErrNotFound", cand, err)
			}
			return
		}
		if got != tok {
			t.Fatalf("Open(%q) = %+v: a forged id opened", cand, got)
		}
	})
}
