package router

import (
	"net/http"
	"strings"
	"testing"

	"github.com/ciproxy/ciproxy/internal/config"
)

const masterKey = "sk-master-0123456789"

func withMasterKey(c *config.Config) { c.General.MasterKey = masterKey }

func TestAuth(t *testing.T) {
	up := newUpstream(t, nil)
	locked := newProxy(t, testConfig(up.URL+"/v1", withMasterKey))
	open := newProxy(t, testConfig(up.URL+"/v1"))
	unset := newProxy(t, testConfig(up.URL+"/v1", func(c *config.Config) {
		c.General.MasterKey, c.General.MissingEnv = "random-key-nobody-knows", "MY_UNSET_MASTER_KEY"
	}))

	cases := []struct {
		name   string
		p      *proxy
		path   string
		header []string
		want   int
	}{
		{"no master key lets anyone in", open, "/v1/models", nil, http.StatusOK},
		{"missing key is refused", locked, "/v1/models", nil, http.StatusUnauthorized},
		{"missing key is refused without the v1 prefix", locked, "/models", nil, http.StatusUnauthorized},
		{"wrong key is refused", locked, "/v1/models", []string{"Authorization", "Bearer sk-wrong"}, http.StatusUnauthorized},
		{"key prefix is refused", locked, "/v1/models", []string{"Authorization", "Bearer " + masterKey[:10]}, http.StatusUnauthorized},
		{"basic auth is not a bearer key", locked, "/v1/models", []string{"Authorization", "Basic " + masterKey}, http.StatusUnauthorized},
		{"right bearer key is accepted", locked, "/v1/models", []string{"Authorization", "Bearer " + masterKey}, http.StatusOK},
		{"bearer scheme is case-insensitive", locked, "/v1/models", []string{"Authorization", "bearer " + masterKey}, http.StatusOK},
		{"right x-api-key is accepted", locked, "/v1/models", []string{"X-Api-Key", masterKey}, http.StatusOK},
		{"metrics need the key", locked, "/metrics", nil, http.StatusUnauthorized},
		{"metrics with the key", locked, "/metrics", []string{"Authorization", "Bearer " + masterKey}, http.StatusOK},
		{"unknown v1 path needs the key first", locked, "/v1/nothing-here", nil, http.StatusUnauthorized},
		{"master key from an unset variable refuses everyone", unset, "/v1/models", []string{"Authorization", "Bearer anything"}, http.StatusUnauthorized},
		{"healthz is open", locked, "/healthz", nil, http.StatusOK},
		{"readyz is open", locked, "/readyz", nil, http.StatusOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := tc.p.do(t, http.MethodGet, tc.path, "", tc.header...)
			if status != tc.want {
				t.Fatalf("GET %s = %d %s; want %d", tc.path, status, body, tc.want)
			}
			if status == http.StatusUnauthorized {
				msg, typ, _, code := decodeError(t, body)
				if code != "invalid_api_key" || typ != "invalid_request_error" {
					t.Errorf("401 body = %s; want type invalid_request_error, code invalid_api_key", body)
				}
				if strings.Contains(msg, masterKey[:10]) || strings.Contains(msg, "sk-wrong") {
					t.Errorf("401 message %q echoes a key", msg)
				}
				if tc.p == unset && !strings.Contains(msg, "MY_UNSET_MASTER_KEY") {
					t.Errorf("401 message %q should name the unset variable", msg)
				}
			}
		})
	}
	if n := len(up.requests()); n != 0 {
		t.Errorf("upstream got %d requests; /v1/models and refusals must not reach it", n)
	}
}

func TestCallerID(t *testing.T) {
	cases := []struct {
		name   string
		header http.Header
		want   string
	}{
		{"no key, no caller", http.Header{}, ""},
		{"bearer key", http.Header{"Authorization": {"Bearer abc"}}, "ba7816bf8f01cfea414140de5dae2223"},
		{"x-api-key", http.Header{"X-Api-Key": {"abc"}}, "ba7816bf8f01cfea414140de5dae2223"},
		{"authorization wins over x-api-key", http.Header{"Authorization": {"Bearer abc"}, "X-Api-Key": {"other"}}, "ba7816bf8f01cfea414140de5dae2223"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := callerID(presentedKey(tc.header)); got != tc.want {
				t.Errorf("callerID(presentedKey(%v)) = %q; want %q", tc.header, got, tc.want)
			}
		})
	}
}
