package intercept

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/listquery"
	"github.com/ciproxy/ciproxy/internal/store"
)

// storedTTL is how long the store keeps a response the engine minted and its calls: a
// conversation continues for a day.
const storedTTL = 24 * time.Hour

// readResponse returns the record of a response id this proxy minted, whoever its owner; found is
// false, with a nil error, when there is none (never minted here, or expired). An error means the
// store could not answer (errors.Is(err, store.ErrUnavailable) when it cannot be reached): the
// caller fails with it rather than go on as if the record did not exist.
func readResponse(ctx context.Context, rs store.Responses, id string) (r store.Response, found bool, err error) {
	r, err = rs.Response(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.Response{}, false, nil
	case err != nil:
		return store.Response{}, false, err
	}
	return r, true, nil
}

// rawItems returns items as a stored response keeps them (nil for none).
func rawItems(items [][]byte) []json.RawMessage {
	if len(items) == 0 {
		return nil
	}
	out := make([]json.RawMessage, len(items))
	for i, it := range items {
		out[i] = it
	}
	return out
}

// readCall is readResponse for the record of a code_interpreter_call item ("ci_...").
func readCall(ctx context.Context, rs store.Responses, id string) (c store.Call, found bool, err error) {
	c, err = rs.Call(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.Call{}, false, nil
	case err != nil:
		return store.Call{}, false, err
	}
	return c, true, nil
}

// Minted reports whether id is a response id this proxy minted and still remembers, whoever its
// owner: GET and DELETE /v1/responses/{id} for it are ServeStored's, since the upstream has never
// heard of it. Any other id passes through to the upstream. An error means the store could not
// answer, so nobody can tell.
func (e *Engine) Minted(ctx context.Context, id string) (bool, error) {
	_, ok, err := readResponse(ctx, e.store, id)
	return ok, err
}

// ServeStored answers GET and DELETE /v1/responses/{id} for a response this proxy minted, as
// OpenAI answers for its stored responses: GET returns the Response the client received (kept
// when the request had store true), with the calls' outputs when the query includes
// code_interpreter_call.outputs (include[]= or include=) and null otherwise, whatever the
// request included; DELETE forgets it. A response minted for another caller, one not kept, or
// one deleted, is a 404, as if it did not exist. An error means nothing was written; the caller
// writes it.
func (e *Engine) ServeStored(w http.ResponseWriter, r *http.Request, id, caller string) error {
	notFound := apierror.NotFound("Response with id '"+id+"' not found.", "")
	sr, ok, err := readResponse(r.Context(), e.store, id)
	if err != nil {
		return err
	}
	if !ok || sr.Owner != caller {
		return notFound
	}
	switch r.Method {
	case http.MethodGet:
		if sr.Body == nil {
			return notFound
		}
		q := r.URL.Query()
		if slices.Contains(q["include[]"], includeOutputs) || slices.Contains(q["include"], includeOutputs) {
			writeJSON(w, sr.Body)
		} else {
			writeJSON(w, withoutOutputs(sr.Body))
		}
	case http.MethodDelete:
		if sr.Body == nil {
			return notFound // not stored, or deleted already
		}
		// What the response held goes; its id stays known, with its owner only, until it
		// expires, so that later requests naming it are answered as for a deleted response rather
		// than passed to an upstream that never heard of it. Its calls stay for stateless replay.
		forgotten := store.Response{ID: id, Owner: sr.Owner, CreatedAt: sr.CreatedAt, ExpiresAt: sr.ExpiresAt}
		if err := e.store.PutResponse(r.Context(), forgotten, nil); err != nil {
			return err
		}
		writeJSON(w, marshal(deletedResponse{ID: id, Object: "response", Deleted: true}))
	default:
		return &apierror.Error{Status: http.StatusMethodNotAllowed, Message: "Method " + r.Method + " is not allowed for " + r.URL.Path + ".", Type: apierror.TypeInvalidRequest}
	}
	return nil
}

// ServeCancel answers POST /v1/responses/{id}/cancel for a response this proxy minted. OpenAI
// cancels only responses created with background true; every response the proxy mints runs
// within its own request, so its own responses get the 400 OpenAI answers for cancelling a
// synchronous one. A response minted for another caller, one not kept, or one
// deleted, is a 404, as for GET. An error means nothing was written; the caller writes it.
func (e *Engine) ServeCancel(w http.ResponseWriter, r *http.Request, id, caller string) error {
	sr, ok, err := readResponse(r.Context(), e.store, id)
	if err != nil {
		return err
	}
	if !ok || sr.Owner != caller || sr.Body == nil {
		return apierror.NotFound("Response with id '"+id+"' not found.", "")
	}
	return apierror.BadRequest("Cannot cancel a synchronous response.", "", "")
}

func writeJSON(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// ServeInputItems answers GET /v1/responses/{id}/input_items for a response this proxy minted,
// in OpenAI's list shape ({"object":"list","data","first_id","last_id","has_more"}): the input
// items of the request as the client sent them, each with an id (minted where the client sent
// none; a string input is one user message of input_text). Query parameters: limit (1 to 100,
// default 20), order (desc, the default, or asc), after (an item id: the page starts after it),
// include (include[]= or include=): code_interpreter_call items show their outputs only with
// code_interpreter_call.outputs, input images their image_url only with
// message.input_image.image_url. A response another caller minted, or one stored without its
// input (store false), is a 404. An error means nothing was written; the caller writes it.
func (e *Engine) ServeInputItems(w http.ResponseWriter, r *http.Request, id, caller string) error {
	sr, ok, err := readResponse(r.Context(), e.store, id)
	if err != nil {
		return err
	}
	if !ok || sr.Owner != caller || sr.Input == nil {
		return apierror.NotFound("Response with id '"+id+"' not found.", "")
	}
	q := r.URL.Query()
	limit, err := listquery.Limit(q, 20, 100)
	if err != nil {
		return err
	}
	order, err := listquery.Order(q)
	if err != nil {
		return err
	}
	include := append(q["include[]"], q["include"]...)

	items := gjson.ParseBytes(sr.Input).Array()
	if order == "desc" {
		slices.Reverse(items)
	}
	start := 0
	if after := q.Get("after"); after != "" {
		start = len(items) // an id that is not in the list: nothing after it
		for i, it := range items {
			if it.Get("id").String() == after {
				start = i + 1
				break
			}
		}
	}
	end := min(start+limit, len(items))
	page := itemList{Object: "list", Data: make([]json.RawMessage, 0, end-start), HasMore: end < len(items)}
	for _, it := range items[start:end] {
		page.Data = append(page.Data, listed(it, slices.Contains(include, includeOutputs), slices.Contains(include, includeImageURL)))
	}
	if n := len(page.Data); n > 0 {
		page.FirstID, page.LastID = nullable(items[start].Get("id").String()), nullable(items[end-1].Get("id").String())
	} else {
		page.FirstID, page.LastID = nullable(""), nullable("")
	}
	writeJSON(w, marshal(page))
	return nil
}

// includeImageURL is the include value that shows input images' URLs in input_items.
const includeImageURL = "message.input_image.image_url"

// itemList is the input_items page.
type itemList struct {
	Object  string            `json:"object"`
	Data    []json.RawMessage `json:"data"`
	FirstID json.RawMessage   `json:"first_id"`
	LastID  json.RawMessage   `json:"last_id"`
	HasMore bool              `json:"has_more"`
}

// listed returns a stored input item as input_items shows it, given what include asks for.
func listed(it gjson.Result, outputs, imageURLs bool) json.RawMessage {
	out := []byte(it.Raw)
	switch it.Get("type").String() {
	case "code_interpreter_call":
		if !outputs {
			out, _ = sjson.SetRawBytes(out, "outputs", []byte("null"))
		}
	case "message":
		if imageURLs {
			break
		}
		it.Get("content").ForEach(func(k, p gjson.Result) bool {
			if p.Get("type").String() == "input_image" && p.Get("image_url").Exists() {
				out, _ = sjson.DeleteBytes(out, "content."+k.String()+".image_url")
			}
			return true
		})
	}
	return out
}

// inputList returns the input of a request body as the JSON array input_items lists: a string
// input is one user message; message items get the shape OpenAI lists them in (id, type,
// status, content as parts, role); every other item is kept as sent. Items without an id get one
// from mint, with the prefix of their type.
func inputList(raw []byte, mint func(string) string) []byte {
	in := gjson.GetBytes(raw, "input")
	b := []byte{'['}
	switch {
	case in.Type == gjson.String:
		b = appendElem(b, listedMessageOf(mint("msg_"), "completed", textParts("user", in), "user"))
	case in.IsArray():
		in.ForEach(func(_, it gjson.Result) bool {
			if !it.IsObject() {
				return true
			}
			id := it.Get("id").String()
			typ := it.Get("type").String()
			if typ == "message" || (typ == "" && it.Get("role").Exists()) {
				if id == "" {
					id = mint("msg_")
				}
				status := it.Get("status").String()
				if status == "" {
					status = "completed"
				}
				role, content := it.Get("role").String(), it.Get("content")
				parts := []byte(content.Raw)
				if content.Type == gjson.String {
					parts = textParts(role, content)
				}
				b = appendElem(b, listedMessageOf(id, status, parts, role))
				return true
			}
			item := []byte(it.Raw)
			if id == "" {
				item, _ = sjson.SetBytes(item, "id", mint(idPrefix(typ)))
			}
			b = appendElem(b, item)
			return true
		})
	}
	return append(b, ']')
}

// listedMessage is the start of a message item in input_items; content and role follow.
type listedMessage struct {
	ID     string `json:"id"`
	Type   string `json:"type"`
	Status string `json:"status"`
}

func listedMessageOf(id, status string, content []byte, role string) []byte {
	b := marshal(listedMessage{ID: id, Type: "message", Status: status})
	b = append(b[:len(b)-1], `,"content":`...)
	b = append(b, content...)
	b = append(b, `,"role":`...)
	b = append(b, jsonString(role)...)
	return append(b, '}')
}

// textPart is a message's text part: input_text, or output_text for the assistant's.
type textPart struct {
	Type        string    `json:"type"`
	Text        string    `json:"text"`
	Annotations *[]string `json:"annotations,omitempty"`
}

// textParts returns a message's string content s as its one text part.
func textParts(role string, s gjson.Result) []byte {
	p := textPart{Type: "input_text", Text: s.String()}
	if role == "assistant" {
		p.Type, p.Annotations = "output_text", &[]string{}
	}
	return marshal([]textPart{p})
}

// idPrefix is the id prefix of an item type, as OpenAI's ids read.
func idPrefix(typ string) string {
	switch typ {
	case "function_call":
		return "fc_"
	case "function_call_output":
		return "fco_"
	case "reasoning":
		return "rs_"
	case "code_interpreter_call":
		return "ci_"
	}
	return "item_"
}
