package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/tidwall/gjson"
)

// openAIUpstream answers chat completions and responses (JSON or streamed) as OpenAI does, echoing
// the model it was asked for, so the test sees the deployment's model name come back.
func openAIUpstream(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	model := gjson.GetBytes(raw, "model").Str
	switch {
	case r.URL.Path == "/v1/chat/completions":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1757600000,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"Hello from upstream.","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9}}`, model)
	case r.URL.Path == "/v1/responses" && !gjson.GetBytes(raw, "stream").Bool():
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, responseJSON(model, "completed", "Hello from upstream."))
	case r.URL.Path == "/v1/responses":
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		seq := 0
		send := func(typ, rest string) {
			fmt.Fprintf(w, "event: %s\ndata: {\"type\":%q,\"sequence_number\":%d,%s}\n\n", typ, typ, seq, rest)
			seq++
			http.NewResponseController(w).Flush()
		}
		send("response.created", `"response":`+responseJSON(model, "in_progress", ""))
		send("response.output_item.added", `"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","content":[],"role":"assistant"}`)
		for _, d := range []string{"Hello", " from", " upstream."} {
			send("response.output_text.delta", fmt.Sprintf(`"item_id":"msg_1","output_index":0,"content_index":0,"delta":%q,"logprobs":[]`, d))
		}
		send("response.output_text.done", `"item_id":"msg_1","output_index":0,"content_index":0,"text":"Hello from upstream.","logprobs":[]`)
		send("response.completed", `"response":`+responseJSON(model, "completed", "Hello from upstream."))
	default:
		http.NotFound(w, r)
	}
}

func responseJSON(model, status, text string) string {
	output := `[]`
	if text != "" {
		output = fmt.Sprintf(`[{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":%q,"annotations":[],"logprobs":[]}]}]`, text)
	}
	return fmt.Sprintf(`{"id":"resp_1","object":"response","created_at":1757600000,"status":%q,"error":null,"incomplete_details":null,"instructions":null,"model":%q,"output":%s,"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"temperature":1.0,"top_p":1.0,"metadata":{},"usage":null}`, status, model, output)
}

func TestOpenAIClient(t *testing.T) {
	up := newUpstream(t, openAIUpstream)
	p := newProxy(t, testConfig(up.URL+"/v1", withMasterKey))
	client := openai.NewClient(
		option.WithBaseURL(p.URL+"/v1/"),
		option.WithAPIKey(masterKey),
		option.WithMaxRetries(0),
	)
	ctx := context.Background()

	t.Run("chat completion", func(t *testing.T) {
		c, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "gpt-test",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) != 1 || c.Choices[0].Message.Content != "Hello from upstream." || c.Model != "gpt-test-upstream" {
			t.Errorf("completion = %+v", c)
		}
	})
	t.Run("response", func(t *testing.T) {
		r, err := client.Responses.New(ctx, responses.ResponseNewParams{
			Model: "gpt-test",
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Say hello")},
		})
		if err != nil {
			t.Fatal(err)
		}
		if r.OutputText() != "Hello from upstream." || r.Status != "completed" {
			t.Errorf("response = %q, %q", r.OutputText(), r.Status)
		}
	})
	t.Run("streamed response", func(t *testing.T) {
		stream := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{
			Model: "gpt-test",
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Say hello")},
		})
		defer stream.Close()
		var types []string
		var text strings.Builder
		for stream.Next() {
			ev := stream.Current()
			if ev.SequenceNumber != int64(len(types)) {
				t.Errorf("event %d has sequence_number %d", len(types), ev.SequenceNumber)
			}
			types = append(types, ev.Type)
			if ev.Type == "response.output_text.delta" {
				text.WriteString(ev.Delta)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if text.String() != "Hello from upstream." || len(types) != 7 || types[len(types)-1] != "response.completed" {
			t.Errorf("stream = %v, text %q", types, text.String())
		}
	})
	t.Run("unknown model is an SDK error with the OpenAI fields", func(t *testing.T) {
		_, err := client.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-nope"})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Code != "model_not_found" || apiErr.Param != "model" {
			t.Errorf("err = %v; want a 400 model_not_found openai.Error", err)
		}
	})
	t.Run("wrong key is an SDK authentication error", func(t *testing.T) {
		bad := openai.NewClient(option.WithBaseURL(p.URL+"/v1/"), option.WithAPIKey("sk-bad"), option.WithMaxRetries(0))
		_, err := bad.Models.List(ctx)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized || apiErr.Code != "invalid_api_key" {
			t.Errorf("err = %v; want a 401 invalid_api_key openai.Error", err)
		}
	})
}
