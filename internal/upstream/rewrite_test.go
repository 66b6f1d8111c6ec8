package upstream

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

func FuzzRewriteModel(f *testing.F) {
	for _, s := range []string{
		`{"model":"alias","input":"hi"}`,
		`{"a":{"model":"x"},"model":"y","model":1}`,
		` { "model" : "\u0061lias" } `,
		`{"mod\u0065l":"alias"}`,
		`[1,2]`,
		`not json`,
	} {
		f.Add([]byte(s), "gpt-4.1")
	}
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		orig := bytes.Clone(body)
		out := rewriteModel(body, model)
		if !bytes.Equal(body, orig) {
			t.Fatal("input modified")
		}
		// Model names come from YAML, which is UTF-8; JSON cannot carry anything else.
		if !json.Valid(body) || !isJSONObject(body) || !utf8.ValidString(model) {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("rewriteModel(%q) = %q is not valid JSON", body, out)
		}
		var in, got map[string]json.RawMessage
		if json.Unmarshal(body, &in) != nil || json.Unmarshal(out, &got) != nil {
			return
		}
		if _, had := in["model"]; had {
			// encoding/json keeps the last duplicate, gjson the first: both must now be model.
			var m string
			if err := json.Unmarshal(got["model"], &m); err != nil || m != model {
				t.Fatalf("last model after rewrite = %s; want %q", got["model"], model)
			}
			if g := gjson.GetBytes(out, "model"); g.String() != model {
				t.Fatalf("first model after rewrite = %q; want %q", g.String(), model)
			}
		} else if !bytes.Equal(out, body) {
			t.Fatalf("body without model changed: %q -> %q", body, out)
		}
		for k, v := range in {
			if k != "model" && !bytes.Equal(got[k], v) {
				t.Fatalf("key %q changed: %s -> %s", k, v, got[k])
			}
		}
	})
}
