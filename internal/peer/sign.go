package peer

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// HeaderForwarded marks a request one replica forwards to another: "t=<unix seconds>,v1=<hex
// HMAC-SHA256>" over the method, the request URI and the time, keyed by the deployment's shared
// secret. A request that carries a valid one is served where it arrives, never forwarded again.
const HeaderForwarded = "X-Ciproxy-Forwarded"

// SignatureWindow is how far a forwarded request's time may be from the receiver's clock: a
// captured signature is replayable only within it, for the same method and URI. It only ever
// makes a replica serve a request itself (the client's own credentials are checked as usual), so
// the window bounds a small power.
const SignatureWindow = 30 * time.Second

var (
	errNoSecret  = errors.New("no shared secret is configured (general_settings.container_secret)")
	errMalformed = errors.New("malformed " + HeaderForwarded + " header")
	errStale     = errors.New(HeaderForwarded + " is outside the time window")
	errBadMAC    = errors.New(HeaderForwarded + " signature does not match")
)

// Sign returns the HeaderForwarded value for a request of method to uri (path and query, as
// the receiver will see them) at t.
func Sign(secret, method, uri string, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, method, uri, ts))
}

// Verify checks a HeaderForwarded value against the request's method and URI at now.
func Verify(secret, value, method, uri string, now time.Time) error {
	if secret == "" {
		return errNoSecret
	}
	tPart, vPart, ok := strings.Cut(value, ",")
	ts, ok1 := strings.CutPrefix(tPart, "t=")
	sig, ok2 := strings.CutPrefix(vPart, "v1=")
	if !ok || !ok1 || !ok2 {
		return errMalformed
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	got, herr := hex.DecodeString(sig)
	if err != nil || herr != nil {
		return errMalformed
	}
	if d := now.Sub(time.Unix(sec, 0)); d > SignatureWindow || d < -SignatureWindow {
		return errStale
	}
	if !hmac.Equal(got, mac(secret, method, uri, ts)) {
		return errBadMAC
	}
	return nil
}

func mac(secret, method, uri, ts string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("ciproxy-forward\n" + method + "\n" + uri + "\n" + ts))
	return m.Sum(nil)
}

// A probe asks the replica at an address to prove that it is one of this deployment's: the request
// (GET /healthz) carries a random nonce in HeaderProbe, and the replica answers with HeaderPeer,
// an HMAC of the nonce and its own advertised address under the shared secret. A probe carries
// no client credential, so asking an address that some other service has taken over reveals
// nothing.
const (
	HeaderProbe = "X-Ciproxy-Probe"
	HeaderPeer  = "X-Ciproxy-Peer"
)

// ProbeAnswer is the HeaderPeer value of the replica at self for a probe's nonce.
func ProbeAnswer(secret, self, nonce string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("ciproxy-probe\n" + self + "\n" + nonce))
	return hex.EncodeToString(m.Sum(nil))
}
