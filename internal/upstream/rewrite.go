package upstream

import (
	"encoding/json"
	"net/http"
	"net/textproto"
	"strings"

	"github.com/tidwall/gjson"
)

// rewriteModel returns body with the value of every top-level "model" key replaced by the JSON
// string model. Every other byte is kept. body is never modified: when a change is needed the
// result is a fresh slice, otherwise it is body itself. A body that is not a JSON object, or has no
// top-level "model", is returned as is.
//
// Every occurrence is replaced, not only the first: parsers disagree on duplicate keys (gjson takes
// the first, Python's json the last), and a second "model" must not slip an unmapped model name
// past the proxy to the operator's account.
func rewriteModel(body []byte, model string) []byte {
	if !isJSONObject(body) {
		return body
	}
	type span struct{ at, n int }
	var spans []span
	same := true
	gjson.ParseBytes(body).ForEach(func(k, v gjson.Result) bool {
		if k.Str == "model" && v.Index > 0 && v.Index+len(v.Raw) <= len(body) {
			spans = append(spans, span{v.Index, len(v.Raw)})
			same = same && v.Type == gjson.String && v.Str == model
		}
		return true
	})
	if len(spans) == 0 || same {
		return body
	}
	quoted, err := json.Marshal(model)
	if err != nil { // a Go string always marshals; keep the body rather than guess
		return body
	}
	size := len(body)
	for _, s := range spans {
		size += len(quoted) - s.n
	}
	out := make([]byte, 0, size)
	prev := 0
	for _, s := range spans {
		if s.at < prev { // not expected from gjson; never emit overlapping edits
			return body
		}
		out = append(out, body[prev:s.at]...)
		out = append(out, quoted...)
		prev = s.at + s.n
	}
	return append(out, body[prev:]...)
}

// isJSONObject reports whether the first non-space byte of b opens a JSON object.
func isJSONObject(b []byte) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		case '{':
			return true
		default:
			return false
		}
	}
	return false
}

// hopHeaders are removed from every upstream request (RFC 7230 section 6.1, and the list
// httputil.ReverseProxy uses). "Te: trailers" is re-added by ReverseProxy for passthrough.
var hopHeaders = []string{
	"Connection",
	"Proxy-Connection",
	"Keep-Alive",
	"Proxy-Authenticate",
	"Proxy-Authorization",
	"Te",
	"Trailer",
	"Transfer-Encoding",
	"Upgrade",
}

// clientOnlyHeaders belong to the client's own relation with the proxy, not to the upstream
// account: its credentials in any of the spellings providers accept, the organization and project
// it would select inside the operator's account, its cookies, and headers that describe the
// inbound connection or body framing, which the transport sets again for each attempt.
var clientOnlyHeaders = []string{
	"Authorization",
	"Api-Key",
	"X-Api-Key",
	"Openai-Organization",
	"Openai-Project",
	"Cookie",
	"Expect",
	"Content-Length",
	"Host",
	"Forwarded",
	"X-Forwarded-For",
	"X-Forwarded-Host",
	"X-Forwarded-Proto",
}

// dropClientHeaders deletes clientOnlyHeaders from h.
func dropClientHeaders(h http.Header) {
	for _, k := range clientOnlyHeaders {
		h.Del(k)
	}
}

// cleanHeader returns a copy of h without hop-by-hop headers (those listed in Connection included)
// and without clientOnlyHeaders. h is not modified.
func cleanHeader(h http.Header) http.Header {
	out := h.Clone()
	if out == nil {
		out = make(http.Header)
	}
	removeHopByHop(out)
	dropClientHeaders(out)
	return out
}

// removeHopByHop deletes the headers named in Connection and the fixed hop-by-hop list from h.
func removeHopByHop(h http.Header) {
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				h.Del(sf)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}
