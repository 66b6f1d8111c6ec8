package agentsandbox

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"
)

// MinSecretLen is the shortest scoped-token secret the router accepts (after trimming).
const MinSecretLen = 32

// scopedTokenContext domain-separates the router's HMAC (its authz/scopedtoken.go).
const scopedTokenContext = "agent-sandbox/scoped-token/v1."

// normalizeSecret trims the secret the way the router does, so that a secret file ending in a
// newline signs the same tokens on both sides.
func normalizeSecret(secret string) []byte { return []byte(strings.TrimSpace(secret)) }

// MintScopedToken returns a router scoped token for the sandbox name in namespace ns, valid until
// exp (exclusive, whole seconds): "v1." + base64url(JSON {"ns","name","exp"}) + "." +
// base64url(HMAC-SHA256(secret, context + payload)), unpadded.
func MintScopedToken(secret []byte, ns, name string, exp time.Time) (string, error) {
	if len(secret) < MinSecretLen {
		return "", errors.New("agent_sandbox: the scoped-token secret is shorter than 32 bytes")
	}
	if ns == "" || name == "" {
		return "", errors.New("agent_sandbox: a scoped token needs a namespace and a sandbox name")
	}
	payload, err := json.Marshal(struct {
		NS   string `json:"ns"`
		Name string `json:"name"`
		Exp  int64  `json:"exp"`
	}{ns, name, exp.Unix()})
	if err != nil {
		return "", err
	}
	enc := base64.RawURLEncoding.EncodeToString(payload)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(scopedTokenContext))
	mac.Write([]byte(enc))
	return "v1." + enc + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil)), nil
}
