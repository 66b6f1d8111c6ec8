package router

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/snapshot"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
	"github.com/ciproxy/ciproxy/internal/store/redisstore"
	"github.com/ciproxy/ciproxy/internal/testutil/redisserver"
	"github.com/ciproxy/ciproxy/internal/upstream"
)

// BenchmarkPassthrough measures one JSON chat completion through the router and the pass-through,
// with the access log encoding to io.Discard, over real loopback sockets on both sides.
func BenchmarkPassthrough(b *testing.B) {
	answer := []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}]}`)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}))
	defer up.Close()
	cfg := testConfig(up.URL+"/v1", func(c *config.Config) { c.General.MasterKey = masterKey })
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel))
	srv := httptest.NewServer(New(Options{
		Store:    snapshot.Fixed(&snapshot.Snapshot{Config: cfg}),
		Client:   upstream.NewClient(upstream.ClientOptions{Logger: log}),
		Balancer: upstream.NewBalancer(),
		Logger:   log,
		Registry: prometheus.NewRegistry(),
	}))
	defer srv.Close()
	body := []byte(`{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}`)
	client := srv.Client()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		postOK(b, client, srv.URL+"/v1/chat/completions", body)
	}
}

// postOK posts body to url with the master key and fails b unless the answer is a 200, read to
// its end.
func postOK(b *testing.B, client *http.Client, url string, body []byte) {
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+masterKey)
	resp, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("status %d", resp.StatusCode)
	}
}

// BenchmarkResponsesPassthrough measures one JSON /v1/responses request with an ordinary 4 KiB
// body (no file_id) passed through to a Responses upstream, with and without the Files API's
// store (whose presence makes the pass-through look for the caller's file ids), and with the
// record of each response's owner in the embedded store or in Redis (owners.go), as the proxy
// runs.
func BenchmarkResponsesPassthrough(b *testing.B) {
	var n atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_%d","object":"response","status":"completed","output":[]}`, n.Add(1))
	}))
	defer up.Close()
	var body bytes.Buffer
	body.WriteString(`{"model":"gpt-test","input":[`)
	for i := 0; body.Len() < 4000; i++ {
		if i > 0 {
			body.WriteByte(',')
		}
		body.WriteString(`{"role":"user","content":[{"type":"input_text","text":"Tell me about the weather in Paris, and then in Rome, please."}]}`)
	}
	body.WriteString(`]}`)
	st, err := embedded.Open(embedded.Options{Dir: b.TempDir(), SweepEvery: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	redisStore := func(b *testing.B) store.Store {
		rs, err := redisstore.Open(context.Background(), redisstore.Options{URL: redisserver.Start(b).URL()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = rs.Close() })
		return rs
	}
	for _, bc := range []struct {
		name   string
		files  store.Files
		owners func(*testing.B) store.Store
	}{
		{"no_files_store", nil, nil},
		{"files_store", st, nil},
		{"files_store+owners_embedded", st, func(*testing.B) store.Store { return st }},
		{"files_store+owners_redis", st, redisStore},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var owners store.Responses
			if bc.owners != nil {
				owners = bc.owners(b)
			}
			cfg := testConfig(up.URL+"/v1", func(c *config.Config) { c.General.MasterKey = masterKey })
			srv := httptest.NewServer(New(Options{
				Store:     snapshot.Fixed(&snapshot.Snapshot{Config: cfg}),
				Client:    upstream.NewClient(upstream.ClientOptions{}),
				Balancer:  upstream.NewBalancer(),
				Registry:  prometheus.NewRegistry(),
				Files:     bc.files,
				Responses: owners,
			}))
			defer srv.Close()
			client := srv.Client()
			b.ReportAllocs()
			for b.Loop() {
				postOK(b, client, srv.URL+"/v1/responses", body.Bytes())
			}
		})
	}
}
