package router

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/snapshot"
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
		Store:    snapshot.NewStore(&snapshot.Snapshot{Config: cfg}),
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
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", bytes.NewReader(body))
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
}
