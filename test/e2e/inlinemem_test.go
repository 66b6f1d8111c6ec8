package e2e

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// Concurrent small requests naming one large stored file, passing through with the file
// inline, must not make the proxy hold the file's bytes per request (they once held three
// copies of its base64 each: 1.2 GB for six requests and a 48 MiB file). Measured as the
// process's peak resident memory (VmHWM) while every request is held at the upstream, which
// has read its whole body.
func TestPassThroughInlineMemoryBounded(t *testing.T) {
	const size, n = 16 << 20, 4
	up := upstreamtest.New(t)
	arrived, gate := make(chan int, n), make(chan struct{})
	up.Script(func(r upstreamtest.Request) upstreamtest.Turn {
		arrived <- len(r.Body)
		<-gate
		return upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("Read.")}, Usage: answerUsage}
	})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	p := startProxy(t, setup{Upstream: up.URL(), Tool: "local", WorkDir: workDir(t)}.yaml())
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
