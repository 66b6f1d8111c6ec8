package e2e

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// countedAnswer is a completed Response as OpenAI sends one, for an upstream that does not read
// what it is asked.
const countedAnswer = `{"id":"resp_counted","object":"response","created_at":1764633600,"status":"completed",` +
	`"completed_at":1764633601,"error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,` +
	`"model":"gpt-4.1","output":[{"id":"msg_counted","type":"message","status":"completed","role":"assistant",` +
	`"content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"Read."}]}],"parallel_tool_calls":true,` +
	`"previous_response_id":null,"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto",` +
	`"tools":[],"top_p":1.0,"truncation":"disabled","usage":{"input_tokens":150,"input_tokens_details":{"cached_tokens":40},` +
	`"output_tokens":5,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":155},"user":null,"metadata":{}}`

// Concurrent small requests naming one large stored file, passing through with the file
// inline, must not make the proxy hold the file's bytes per request (they once held three
// copies of its base64 each: 1.2 GB for six requests and a 48 MiB file). Measured as the
// process's peak resident memory (VmHWM) while every request is held at the upstream, which
// has read its whole body.
func TestPassThroughInlineMemoryBounded(t *testing.T) {
	const size, n = 16 << 20, 4
	// The upstream only counts what it receives: a scripted upstream that checks each body as
	// OpenAI would decodes these 21 MiB bodies several times, which under the race detector
	// costs tens of CPU seconds per request and is no part of what this test measures.
	arrived, gate := make(chan int64, n), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ := io.Copy(io.Discard, r.Body)
		arrived <- got
		<-gate
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, countedAnswer)
	}))
	t.Cleanup(up.Close)
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	p := startProxy(t, setup{Upstream: up.URL, Tool: "local", WorkDir: workDir(t)}.yaml())
	alice := sdk(p, "sk-alice")
	data := append([]byte("%PDF-1.4\n"), bytes.Repeat([]byte("x"), size-9)...)
	id := uploadUserData(t, alice, "big.pdf", "application/pdf", data)
	before := peakRSS(t, p.cmd.Process.Pid)

	params := responses.ResponseNewParams{
		Model: clientModel,
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			responses.ResponseInputItemParamOfMessage(responses.ResponseInputMessageContentListParam{
				{OfInputText: &responses.ResponseInputTextParam{Text: "Read it."}},
				{OfInputFile: &responses.ResponseInputFileParam{FileID: openai.String(id)}},
			}, responses.EasyInputMessageRoleUser),
		}},
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { _, errs[i] = alice.Responses.New(ctx(t, 120*time.Second), params) })
	}
	for range n {
		if got := <-arrived; got < size*4/3 {
			t.Errorf("the upstream got %d bytes; want the file inline", got)
		}
	}
	during := peakRSS(t, p.cmd.Process.Pid)
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
	t.Logf("peak resident memory %d MiB before the requests, %d MiB with them in flight", before>>20, during>>20)
	// One copy of the file's base64 for all the requests together is 21 MiB; allow half.
	if grown := during - before; grown > size*2/3 {
		t.Errorf("%d requests of a %d MiB file grew the proxy's peak memory by %d MiB; want under %d MiB", n, size>>20, grown>>20, size*2/3>>20)
	}
}
