package agentsandbox

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// verify checks tok the way the router's scoped-token authorizer does.
func verify(t *testing.T, secret []byte, tok string) (ns, name string, exp int64) {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[0] != "v1" {
		t.Fatalf("token %q is not v1.<payload>.<sig>", tok)
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("agent-sandbox/scoped-token/v1." + parts[1]))
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !hmac.Equal(sig, mac.Sum(nil)) {
		t.Fatalf("bad signature")
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		NS, Name string
		Exp      int64
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return c.NS, c.Name, c.Exp
}

func TestMintScopedToken(t *testing.T) {
	secret := normalizeSecret("  0123456789abcdef0123456789abcdef\n")
	exp := time.Unix(1900000000, 0)
	tok, err := MintScopedToken(secret, "sandboxes", "ciproxy-python-abc12", exp)
	if err != nil {
		t.Fatal(err)
	}
	if ns, name, e := verify(t, []byte("0123456789abcdef0123456789abcdef"), tok); ns != "sandboxes" || name != "ciproxy-python-abc12" || e != exp.Unix() {
		t.Errorf("claims = %s %s %d", ns, name, e)
	}
	if strings.ContainsAny(tok, "=+/") {
		t.Errorf("token %q is not unpadded base64url", tok)
	}
	if _, err := MintScopedToken([]byte("short"), "a", "b", exp); err == nil {
		t.Error("a short secret signs")
	}
	if _, err := MintScopedToken(secret, "", "b", exp); err == nil {
		t.Error("no namespace signs")
	}
}
