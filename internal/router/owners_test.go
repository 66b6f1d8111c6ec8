package router

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
	"github.com/ciproxy/ciproxy/internal/store/redisstore"
	"github.com/ciproxy/ciproxy/internal/testutil/redisserver"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// toolInterceptor intercepts the requests that carry the code_interpreter tool, as the engine
// does, and answers them as namedInterceptor.
type toolInterceptor struct{ namedInterceptor }

func (ti toolInterceptor) Prepare(ctx context.Context, r *intercept.Request) (*intercept.Plan, error) {
	return planned(ctx, ti.eng, r, strings.Contains(string(r.Body), `"code_interpreter"`), ti.Minted)
}

// ownerStores are the stores the owner records are tested on: the embedded one and Redis.
func ownerStores(t *testing.T) map[string]func(t *testing.T) store.Store {
	return map[string]func(t *testing.T) store.Store{
		"embedded": func(t *testing.T) store.Store {
			st, err := embedded.Open(embedded.Options{Dir: t.TempDir(), SweepEvery: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			return st
		},
		"redis": func(t *testing.T) store.Store {
			srv := redisserver.Start(t)
			st, err := redisstore.Open(context.Background(), redisstore.Options{URL: srv.URL()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			return st
		},
	}
}

// createdID is the id of the response a POST /v1/responses answer carries: the JSON Response's,
// or the response.created event's.
func createdID(t *testing.T, body []byte, stream bool) string {
	t.Helper()
	if !stream {
		return gjson.GetBytes(body, "id").String()
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && gjson.Get(data, "type").String() == "response.created" {
			return gjson.Get(data, "response.id").String()
		}
	}
	t.Fatalf("no response.created event in %s", body)
	return ""
}

// TestUpstreamResponsesBelongToTheirKey: a response the upstream stored for a request that passed
// through is its key's alone. Another key gets OpenAI's "not found" for it on every by-id route
// and as previous_response_id (intercepted or not), and nothing of that reaches the upstream,
// which would answer anyone with the deployment's key; so does the master key, and so does any
// key for an id the proxy never saw created. The owner continues and reads it as before.
func TestUpstreamResponsesBelongToTheirKey(t *testing.T) {
	for name, open := range ownerStores(t) {
		t.Run(name, func(t *testing.T) {
			up := upstreamtest.New(t)
			cfg, err := config.ParseWith([]byte(`model_list:
  - model_name: gpt-test
    litellm_params: {model: openai/gpt-up, api_base: `+up.URL()+`, api_key: sk-upstream-SECRET}
general_settings:
  master_key: `+quotaMK+`
  client_keys:
    - {name: alice, key: `+aliceKey+`}
    - {name: bob, key: `+bobKey+`}
`), "t.yaml", config.ParseOptions{LookupEnv: func(string) (string, bool) { return "", false }})
			if err != nil {
				t.Fatal(err)
			}
			p := newProxy(t, cfg, func(o *Options) {
				o.Responses = open(t)
				o.Interceptor = toolInterceptor{namedInterceptor{name: "engine"}}
			})
			alice := []string{"Authorization", "Bearer " + aliceKey}
			bob := []string{"Authorization", "Bearer " + bobKey}
			master := []string{"Authorization", "Bearer " + quotaMK}

			for _, stream := range []bool{false, true} {
				up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("alice's secret answer")}})
				status, _, body := p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"hi","stream":`+map[bool]string{false: "false", true: "true"}[stream]+`}`, alice...)
				if status != http.StatusOK {
					t.Fatalf("alice's POST = %d %s", status, body)
				}
				id := createdID(t, body, stream)
				if _, ok := up.Response(id); !ok || id == "" {
					t.Fatalf("the upstream stored no response %q", id)
				}

				// The owner reads it, as from the upstream.
				if status, _, body := p.do(t, http.MethodGet, "/v1/responses/"+id, "", alice...); status != http.StatusOK || !strings.Contains(string(body), "alice's secret answer") {
					t.Fatalf("alice's GET = %d %s; want her response", status, body)
				}
				before := len(up.Requests())
				for _, who := range []struct {
					name   string
					header []string
				}{{"bob", bob}, {"the master key", master}} {
					for _, rt := range []struct{ method, path string }{
						{http.MethodGet, "/v1/responses/" + id},
						{http.MethodGet, "/responses/" + id},
						{http.MethodDelete, "/v1/responses/" + id},
						{http.MethodGet, "/v1/responses/" + id + "/input_items"},
						{http.MethodPost, "/v1/responses/" + id + "/cancel"},
					} {
						status, _, body := p.do(t, rt.method, rt.path, "", who.header...)
						msg, typ, param, code := decodeError(t, body)
						if status != http.StatusNotFound || msg != "Response with id '"+id+"' not found." || typ != "invalid_request_error" || param != "" || code != "" {
							t.Errorf("%s: %s %s = %d %s; want OpenAI's 404 for a missing response", who.name, rt.method, rt.path, status, body)
						}
					}
					for _, req := range []string{
						`{"model":"gpt-test","input":"go on","previous_response_id":"` + id + `"}`,
						`{"model":"gpt-test","input":"go on","previous_response_id":"` + id + `","stream":true}`,
						`{"model":"gpt-test","input":"go on","previous_response_id":"` + id + `","tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`,
					} {
						status, _, body := p.do(t, http.MethodPost, "/v1/responses", req, who.header...)
						msg, _, param, code := decodeError(t, body)
						if status != http.StatusBadRequest || msg != "Previous response with id '"+id+"' not found." || param != "previous_response_id" || code != "previous_response_not_found" {
							t.Errorf("%s continuing alice's response: %s = %d %s; want previous_response_not_found", who.name, req, status, body)
						}
					}
				}
				// An id nobody created through the proxy: refused, with client keys configured.
				for _, who := range [][]string{alice, bob, master} {
					if status, _, body := p.do(t, http.MethodGet, "/v1/responses/resp_made_elsewhere", "", who...); status != http.StatusNotFound {
						t.Errorf("GET of an id with no owner = %d %s; want 404", status, body)
					}
				}
				if n := len(up.Requests()); n != before {
					t.Fatalf("the upstream got %d requests for ids their callers do not own", n-before)
				}

				// The owner continues it.
				up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("more")}})
				if status, _, body := p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"go on","previous_response_id":"`+id+`"}`, alice...); status != http.StatusOK {
					t.Fatalf("alice continuing her response = %d %s", status, body)
				}
				if got := up.Requests()[len(up.Requests())-1].PreviousResponseID; got != id {
					t.Errorf("the upstream was sent previous_response_id %q; want %q", got, id)
				}
			}

			// Chat Completions' stored completions are not served at all: nothing to read there.
			before := len(up.Requests())
			if status, _, body := p.do(t, http.MethodGet, "/v1/chat/completions/chatcmpl-1", "", bob...); status != http.StatusNotFound {
				t.Errorf("GET /v1/chat/completions/{id} = %d %s; want 404", status, body)
			}
			if n := len(up.Requests()); n != before {
				t.Errorf("GET /v1/chat/completions/{id} reached the upstream")
			}
		})
	}
}

// TestUpstreamResponsesInAnOpenProxy: without keys, owners are derived from whatever key a client
// sends, so another key is still refused a recorded id; an id with no record passes through, since
// an open proxy cannot tell whose it is.
func TestUpstreamResponsesInAnOpenProxy(t *testing.T) {
	up := upstreamtest.New(t)
	p := newProxy(t, testConfig(up.URL()), func(o *Options) { o.Responses = ownerStores(t)["embedded"](t) })
	up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("x's answer")}})
	_, _, body := p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"hi"}`, "Authorization", "Bearer x")
	id := createdID(t, body, false)
	if status, _, body := p.do(t, http.MethodGet, "/v1/responses/"+id, "", "Authorization", "Bearer y"); status != http.StatusNotFound {
		t.Errorf("another key's GET = %d %s; want 404", status, body)
	}
	if status, _, body := p.do(t, http.MethodGet, "/v1/responses/"+id, "", "Authorization", "Bearer x"); status != http.StatusOK {
		t.Errorf("the owner's GET = %d %s; want 200", status, body)
	}
	before := len(up.Requests())
	p.do(t, http.MethodGet, "/v1/responses/resp_made_elsewhere", "", "Authorization", "Bearer y")
	if n := len(up.Requests()); n != before+1 {
		t.Errorf("an id with no record did not pass through in an open proxy")
	}
}
