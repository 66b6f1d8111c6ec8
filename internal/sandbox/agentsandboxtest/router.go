package agentsandboxtest

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The router double, after upstream's sandbox-router (proxy/*.go, authz/scopedtoken.go):
// routing by X-Sandbox-ID / -Namespace / -Port through the name cache (a Sandbox's pod IP),
// the same JSON errors, HTTP/1.1 upstream, Host and Authorization stripped, X-Forwarded-*
// added. Dial failures are not retried (upstream retries 3× over 1.4 s, then answers the
// same 502).

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

const scopedTokenMACContext = "agent-sandbox/scoped-token/v1."

func routerError(w http.ResponseWriter, code int, detail string) {
	writeJSON(w, code, map[string]string{"detail": detail})
}

func (s *Server) routerHandler() http.Handler {
	transport := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		ForceAttemptHTTP2:     false,
		MaxIdleConnsPerHost:   16,
		ResponseHeaderTimeout: 180 * time.Second,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Sandbox-ID")
		if id == "" {
			routerError(w, http.StatusBadRequest, "X-Sandbox-ID header is required.")
			return
		}
		if len(id) > 63 || !dnsLabel.MatchString(id) {
			routerError(w, http.StatusBadRequest, "Invalid sandbox ID format.")
			return
		}
		ns := r.Header.Get("X-Sandbox-Namespace")
		if ns == "" {
			ns = "default"
		}
		if len(ns) > 63 || !dnsLabel.MatchString(ns) {
			routerError(w, http.StatusBadRequest, "Invalid namespace format.")
			return
		}
		port := 8888
		if raw := r.Header.Get("X-Sandbox-Port"); raw != "" {
			n, err := strconv.Atoi(raw)
			if err != nil || n < 1 || n > 65535 {
				routerError(w, http.StatusBadRequest, "Invalid port format.")
				return
			}
			port = n
		}
		podIP := r.Header.Get("X-Sandbox-Pod-IP")
		if s.opts.RouterAuthz == "scoped-token" {
			switch s.authorizeScoped(r, ns, id) {
			case http.StatusUnauthorized:
				routerError(w, http.StatusUnauthorized, "unauthenticated")
				return
			case http.StatusForbidden:
				routerError(w, http.StatusForbidden, "forbidden")
				return
			}
		}
		s.mu.Lock()
		target := ""
		if podIP != "" {
			// The double's pods are on loopback, which the real router refuses: a Pod-IP
			// header is accepted only when it names a live pod.
			for _, p := range s.pods {
				if p.pod != nil && p.pod.ip == podIP {
					target = podIP
				}
			}
			if target == "" {
				s.mu.Unlock()
				routerError(w, http.StatusBadRequest, "Invalid target IP address.")
				return
			}
		} else if sb := s.st.objects["sandboxes"][key(ns, id)]; sb != nil {
			if p := s.pods[id]; p != nil && p.pod != nil && !p.failed {
				target = p.pod.ip
			}
		}
		s.mu.Unlock()
		if target == "" {
			routerError(w, http.StatusBadGateway, "Could not connect to the backend sandbox: "+id)
			return
		}
		u := &url.URL{Scheme: "http", Host: net.JoinHostPort(target, strconv.Itoa(port))}
		rp := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(u)
				pr.SetXForwarded()
				pr.Out.Host = ""
				pr.Out.Header.Del("Authorization")
			},
			Transport: transport,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				routerError(w, http.StatusBadGateway, "Could not connect to the backend sandbox: "+id)
			},
		}
		rp.ServeHTTP(w, r)
	})
	return mux
}

// authorizeScoped is upstream's ScopedTokenAuthorizer.Authorize: 0 (allowed), 401 or 403.
func (s *Server) authorizeScoped(r *http.Request, ns, name string) int {
	s.mu.Lock()
	refuse := s.refuseTokens
	s.mu.Unlock()
	auth := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || token == "" || refuse {
		return http.StatusUnauthorized
	}
	claims, ok := verifyScopedToken([]byte(s.secret), token, time.Now())
	if !ok {
		return http.StatusUnauthorized
	}
	if r.Header.Get("X-Sandbox-Pod-IP") != "" || r.Header.Get("X-Sandbox-UID") != "" {
		return http.StatusForbidden
	}
	if claims.Namespace != ns || claims.Name != name {
		return http.StatusForbidden
	}
	return 0
}

type scopedClaims struct {
	Namespace string `json:"ns"`
	Name      string `json:"name"`
	Exp       int64  `json:"exp"`
}

func signScopedToken(secret []byte, encPayload string) []byte {
	mac := hmac.New(sha256.New, bytes.TrimSpace(secret))
	mac.Write([]byte(scopedTokenMACContext))
	mac.Write([]byte(encPayload))
	return mac.Sum(nil)
}

func verifyScopedToken(secret []byte, token string, now time.Time) (scopedClaims, bool) {
	version, rest, ok := strings.Cut(token, ".")
	if !ok || version != "v1" {
		return scopedClaims{}, false
	}
	encPayload, encSig, ok := strings.Cut(rest, ".")
	if !ok {
		return scopedClaims{}, false
	}
	sig, err := base64.RawURLEncoding.DecodeString(encSig)
	if err != nil || !hmac.Equal(sig, signScopedToken(secret, encPayload)) {
		return scopedClaims{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(encPayload)
	if err != nil {
		return scopedClaims{}, false
	}
	var c scopedClaims
	if json.Unmarshal(payload, &c) != nil || now.Unix() >= c.Exp {
		return scopedClaims{}, false
	}
	return c, true
}

// MintScopedToken mints the router's v1 scoped token for (ns, name), valid until exp
// (exclusive, second resolution), with the Server's secret.
func (s *Server) MintScopedToken(ns, name string, exp time.Time) string {
	payload, _ := json.Marshal(scopedClaims{Namespace: ns, Name: name, Exp: exp.Unix()})
	enc := base64.RawURLEncoding.EncodeToString(payload)
	return "v1." + enc + "." + base64.RawURLEncoding.EncodeToString(signScopedToken([]byte(s.secret), enc))
}
