package e2e

import (
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// TestChatDeploymentOpenAIGo drives /v1/responses with openai-go against a deployment whose
// upstream speaks only Chat Completions (model_info.supported_endpoints), served as vLLM and as
// llama.cpp serve it: the code interpreter loop, JSON and streamed, a continued conversation, the
// stored response's GET, input_items and DELETE, a response without the tool, a field that cannot
// be translated, and /v1/chat/completions passed through.
func TestChatDeploymentOpenAIGo(t *testing.T) {
	t.Parallel()
	for _, fl := range []struct {
		name   string
		f      upstreamtest.ChatFlavour
		cached bool // the server reports cached tokens
	}{{"vllm", upstreamtest.ChatVLLM, true}, {"llamacpp", upstreamtest.ChatLlamaCpp, false}} {
		t.Run(fl.name, func(t *testing.T) {
			t.Parallel()
			up := upstreamtest.New(t, upstreamtest.WithChatFlavour(fl.f))
			up.Script(runUserCode)
			p := startProxy(t, setup{Upstream: up.URL(), ChatOnly: true}.yaml())
			client := sdk(p, "sk-chat-a")
			c := ctx(t, 90*time.Second)

			created, err := client.Responses.New(c, ciParams("print(6 * 7)", ""))
			if err != nil {
				t.Fatalf("Responses.New: %v", err)
			}
			checkSixTimesSevenUsage(t, created, fl.cached)
			for _, r := range up.Requests() {
				if r.Path != "/v1/chat/completions" {
					t.Fatalf("the upstream got %s; want only /v1/chat/completions", r.Path)
				}
			}

			t.Run("stream", func(t *testing.T) {
				stream := client.Responses.NewStreaming(c, ciParams("print(6 * 7)", ""))
				var code strings.Builder
				var final *responses.Response
				var types []string
				for stream.Next() {
					ev := stream.Current()
					types = append(types, ev.Type)
					switch e := ev.AsAny().(type) {
					case responses.ResponseCodeInterpreterCallCodeDeltaEvent:
						code.WriteString(e.Delta)
					case responses.ResponseCompletedEvent:
						final = &e.Response
					}
				}
				if err := stream.Err(); err != nil {
					t.Fatalf("stream: %v", err)
				}
				if final == nil {
					t.Fatalf("no response.completed; events: %v", types)
				}
				if code.String() != "print(6 * 7)" {
					t.Errorf("code deltas join to %q", code.String())
				}
				for _, want := range []string{"response.created", "response.code_interpreter_call.in_progress", "response.code_interpreter_call_code.done",
					"response.code_interpreter_call.interpreting", "response.code_interpreter_call.completed", "response.output_text.delta"} {
					if !contains(types, want) {
						t.Errorf("no %s event; events: %v", want, types)
					}
				}
				checkSixTimesSevenUsage(t, final, fl.cached)
				if a, b := normalized(t, created.RawJSON()), normalized(t, final.RawJSON()); !reflect.DeepEqual(a, b) {
					t.Errorf("the stream's final response differs from Responses.New's:\nnew:    %s\nstream: %s", mustJSON(a), mustJSON(b))
				}
			})

			t.Run("previous_response_id", func(t *testing.T) {
				params := ciParams("print(6 * 7)", "")
				params.PreviousResponseID = openai.String(created.ID)
				before := len(up.Requests())
				r, err := client.Responses.New(c, params)
				if err != nil {
					t.Fatalf("continuing %s: %v", created.ID, err)
				}
				checkSixTimesSevenUsage(t, r, fl.cached)
				if r.PreviousResponseID != created.ID {
					t.Errorf("previous_response_id %q, want %q", r.PreviousResponseID, created.ID)
				}
				// The upstream keeps nothing: the proxy resent the earlier exchange.
				reqs := up.Requests()[before:]
				if len(reqs) == 0 || len(reqs[0].History) < 5 {
					t.Fatalf("the continuation's first upstream request saw %d items, want the earlier exchange too", len(reqs[0].History))
				}
			})

			t.Run("stored: GET, input_items, DELETE", func(t *testing.T) {
				got, err := client.Responses.Get(c, created.ID, responses.ResponseGetParams{})
				if err != nil || got.ID != created.ID || got.OutputText() != created.OutputText() {
					t.Fatalf("Responses.Get = %v, %v", err, got)
				}
				items, err := client.Responses.InputItems.List(c, created.ID, responses.InputItemListParams{})
				if err != nil || len(items.Data) != 1 || items.Data[0].Type != "message" {
					t.Fatalf("InputItems.List = %v, %v", err, items)
				}
				if m := items.Data[0].AsMessage(); m.Role != "user" || len(m.Content) != 1 || m.Content[0].Text != "print(6 * 7)" {
					t.Errorf("input item = %s", items.Data[0].RawJSON())
				}
				other := sdk(p, "sk-chat-b")
				if _, err := other.Responses.Get(c, created.ID, responses.ResponseGetParams{}); !isStatus(err, http.StatusNotFound) {
					t.Errorf("another key's GET: %v, want 404", err)
				}
				if err := client.Responses.Delete(c, created.ID); err != nil {
					t.Fatalf("Responses.Delete: %v", err)
				}
				if _, err := client.Responses.Get(c, created.ID, responses.ResponseGetParams{}); !isStatus(err, http.StatusNotFound) {
					t.Errorf("GET after DELETE: %v, want 404", err)
				}
			})

			t.Run("without code_interpreter", func(t *testing.T) {
				r, err := client.Responses.New(c, responses.ResponseNewParams{
					Model: clientModel, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
				})
				if err != nil || r.OutputText() != "plain answer" || !strings.HasPrefix(r.ID, "resp_") {
					t.Errorf("plain response = %v, %v", err, r)
				}
			})

			t.Run("an untranslatable tool is a 400 naming it", func(t *testing.T) {
				params := ciParams("print(1)", "")
				params.Tools = append(params.Tools, responses.ToolUnionParam{OfWebSearch: &responses.WebSearchToolParam{Type: responses.WebSearchToolTypeWebSearch}})
				before := len(up.Requests())
				_, err := client.Responses.New(c, params)
				var apiErr *openai.Error
				if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "tools[1].type" {
					t.Errorf("web_search on a chat deployment: %v, want a 400 naming tools[1].type", err)
				}
				if len(up.Requests()) != before {
					t.Error("the refused request reached the upstream")
				}
			})

			t.Run("chat completions pass through", func(t *testing.T) {
				chat, err := client.Chat.Completions.New(c, openai.ChatCompletionNewParams{
					Model: clientModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
				})
				if err != nil || len(chat.Choices) != 1 || chat.Choices[0].Message.Content != "plain answer" {
					t.Errorf("chat completion = %v, %v", err, chat)
				}
			})
		})
	}
}

func isStatus(err error, status int) bool {
	var apiErr *openai.Error
	return errors.As(err, &apiErr) && apiErr.StatusCode == status
}
