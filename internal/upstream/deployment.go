package upstream

import (
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/config"
)

// What a request to one deployment is made of beyond the client's bytes: the body with the
// deployment's model and default params (DeploymentBody), the URL (Azure's paths and api-version
// included), and the credential and extra headers. Target.Post and Target.Proxy build every
// upstream request this way, so pass-through and the intercept engine's calls get the same.

// DeploymentBody returns body as it is sent to d for a request to urlPath (an OpenAI API path
// without /v1: "/responses", "/chat/completions", ...): the top-level "model" replaced by d's
// upstream model (every other byte kept), and d's default request parameters and extra_body keys
// added at the top level where the client did not set them, as LiteLLM merges litellm_params: the
// client's own value wins, whole (a shallow merge: a client's "metadata" replaces the default's).
//
// The defaults are written in Chat Completions names. A Chat Completions body takes them all; a
// Responses body takes those with a Responses counterpart (max_tokens and max_completion_tokens
// become max_output_tokens, reasoning_effort reasoning.effort, verbosity text.verbosity;
// temperature, top_p, user, parallel_tool_calls, store, metadata, service_tier and top_logprobs keep
// their names) and none of the others (seed, stop, n, penalties, logit_bias, response_format,
// tools, ...), which the Responses API would refuse; a legacy completions body takes the sampling
// parameters it has; an embeddings body only user. extra_body goes to all four as it is written.
//
// A body that is not a JSON object, and a request to any other path, get only the model. body is
// never modified.
func DeploymentBody(d config.Deployment, urlPath string, body []byte) []byte {
	out := rewriteModel(body, d.UpstreamModel)
	if len(d.Params) == 0 && len(d.ExtraBody) == 0 {
		return out
	}
	names, ok := paramNames[path.Clean("/"+urlPath)]
	if !ok || !isJSONObject(out) {
		return out
	}
	present := map[string]bool{}
	root := gjson.ParseBytes(out)
	if !root.IsObject() {
		return out
	}
	root.ForEach(func(k, _ gjson.Result) bool {
		present[k.Str] = true
		return true
	})
	var add []member
	var nested []config.Param // "parent.child" targets whose parent the client set
	for _, p := range d.Params {
		target, ok := names(p.Name)
		if !ok || present[target] || presentAlias(present, p.Name) {
			continue
		}
		parent, child, isNested := strings.Cut(target, ".")
		switch {
		case !isNested:
			add = append(add, member{target, p.Value})
			present[target] = true
		case present[parent]:
			nested = append(nested, config.Param{Name: target, Value: p.Value})
		default:
			obj := append(append(append([]byte(`{"`), child...), `":`...), p.Value...)
			add = append(add, member{parent, append(obj, '}')})
			present[parent] = true
		}
	}
	for _, p := range d.ExtraBody {
		if !present[p.Name] {
			add = append(add, member{p.Name, p.Value})
			present[p.Name] = true
		}
	}
	if len(add) > 0 {
		out = appendMembers(out, add)
	}
	for _, p := range nested {
		parent, child, _ := strings.Cut(p.Name, ".")
		v := gjson.GetBytes(out, parent)
		if !v.IsObject() || v.Get(child).Exists() {
			continue // the client's own value, whole
		}
		if edited, err := sjson.SetRawBytesOptions(out, p.Name, p.Value, &sjson.Options{ReplaceInPlace: false}); err == nil {
			out = edited
		}
	}
	return out
}

// member is a key and its JSON value, to add to an object.
type member struct {
	key   string
	value []byte
}

// appendMembers returns a fresh copy of obj, a JSON object, with members added before its closing
// brace.
func appendMembers(obj []byte, add []member) []byte {
	end := len(obj) - 1
	for end >= 0 && obj[end] != '}' {
		end--
	}
	if end < 0 {
		return obj
	}
	before := end - 1
	for before >= 0 && strings.IndexByte(" \t\r\n", obj[before]) >= 0 {
		before--
	}
	empty := before >= 0 && obj[before] == '{'
	size := len(obj)
	for _, m := range add {
		size += len(m.key) + len(m.value) + 4
	}
	out := make([]byte, 0, size)
	out = append(out, obj[:end]...)
	for i, m := range add {
		if i > 0 || !empty {
			out = append(out, ',')
		}
		out = appendJSONString(out, m.key)
		out = append(out, ':')
		out = append(out, m.value...)
	}
	return append(out, obj[end:]...)
}

// appendJSONString appends s as a JSON string. Parameter names are the vocabulary's (plain ASCII)
// or extra_body keys from the file, which may hold anything.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// paramAliases are default parameters that say the same as another: a client that sets one of a
// group gets no default for the others (OpenAI refuses max_tokens beside max_completion_tokens).
var paramAliases = [][]string{
	{"max_tokens", "max_completion_tokens", "max_output_tokens"},
	{"tools", "functions"},
	{"tool_choice", "function_call"},
}

// presentAlias reports whether the body sets a parameter that says what name says.
func presentAlias(present map[string]bool, name string) bool {
	for _, group := range paramAliases {
		if !slices.Contains(group, name) {
			continue
		}
		for _, other := range group {
			if present[other] {
				return true
			}
		}
	}
	return false
}

// paramNames maps each API path to the function that names a default parameter in that API's
// body ("" and false: the API has no such parameter).
var paramNames = map[string]func(string) (string, bool){
	"/chat/completions": func(name string) (string, bool) { return name, true },
	"/responses": func(name string) (string, bool) {
		target, ok := responsesParams[name]
		return target, ok
	},
	"/completions": func(name string) (string, bool) { return name, slices.Contains(completionsParams, name) },
	"/embeddings":  func(name string) (string, bool) { return name, name == "user" },
}

// responsesParams are the Chat Completions parameters that the Responses API has, and its name for
// each ("parent.child" for a field of an object).
var responsesParams = map[string]string{
	"temperature":           "temperature",
	"top_p":                 "top_p",
	"max_completion_tokens": "max_output_tokens",
	"max_tokens":            "max_output_tokens",
	"user":                  "user",
	"parallel_tool_calls":   "parallel_tool_calls",
	"store":                 "store",
	"metadata":              "metadata",
	"service_tier":          "service_tier",
	"top_logprobs":          "top_logprobs",
	"reasoning_effort":      "reasoning.effort",
	"verbosity":             "text.verbosity",
}

// completionsParams are the parameters of the legacy completions API (and of the OpenAI-compatible
// servers that serve it).
var completionsParams = []string{
	"temperature", "top_p", "n", "stop", "max_tokens", "presence_penalty", "frequency_penalty",
	"logit_bias", "user", "seed", "top_k", "min_p", "repetition_penalty",
}

// Azure OpenAI's default api-version values, LiteLLM's: AZURE_DEFAULT_API_VERSION for the
// deployment routes, AZURE_DEFAULT_RESPONSES_API_VERSION for the Responses API.
const (
	azureDefaultAPIVersion       = "2025-02-01-preview"
	azureDefaultResponsesVersion = "preview"
)

// azureDeploymentRoutes are the routes Azure serves under /openai/deployments/{deployment}.
var azureDeploymentRoutes = []string{
	"/chat/completions", "/completions", "/embeddings",
	"/audio/transcriptions", "/audio/translations", "/audio/speech", "/images/generations",
}

// endpointURL returns the URL of urlPath (an OpenAI API path without /v1) on d, with rawQuery (the
// client's query) added.
//
// For Azure it follows LiteLLM: the deployment routes go to
// {api_base}/openai/deployments/{deployment}{route}?api-version=V, the Responses API to
// {api_base}/openai/responses[...]?api-version=V. The version is the deployment's, else
// 2025-02-01-preview for the deployment routes and "preview" for Responses. When the version is
// "preview" or "latest" (LiteLLM's markers of Azure's v1 API), every route goes to
// {api_base}/openai/v1{route}?api-version=V; a version "v1", or an api_base already ending in
// /openai/v1 with no version given, uses the v1 API without api-version. The client's own
// api-version is replaced.
func endpointURL(d config.Deployment, urlPath, rawQuery string) (*url.URL, error) {
	if d.Provider != "azure" {
		return joinURL(d.APIBase, urlPath, rawQuery)
	}
	u, err := joinURL(d.APIBase, "", "")
	if err != nil {
		return nil, err
	}
	route := path.Clean("/" + urlPath)
	root := strings.TrimRight(u.Path, "/")
	v1Base := strings.HasSuffix(root, "/openai/v1")
	root = strings.TrimSuffix(strings.TrimSuffix(root, "/openai/v1"), "/openai")

	responses := route == "/responses" || strings.HasPrefix(route, "/responses/")
	version := d.APIVersion
	switch {
	case version != "":
	case v1Base:
		version = "v1"
	case responses:
		version = azureDefaultResponsesVersion
	default:
		version = azureDefaultAPIVersion
	}
	v1 := v1Base || version == "preview" || version == "latest" || version == "v1"
	switch {
	case v1:
		u.Path = root + "/openai/v1" + route
	case responses:
		u.Path = root + "/openai" + route
	case slices.Contains(azureDeploymentRoutes, route):
		// The deployment name is one path segment, whatever it holds.
		u.Path = root + "/openai/deployments/" + d.UpstreamModel + route
		u.RawPath = (&url.URL{Path: root}).EscapedPath() + "/openai/deployments/" + url.PathEscape(d.UpstreamModel) + route
	default:
		u.Path = root + "/openai" + route
	}
	if !strings.Contains(u.Path, "/openai/deployments/") {
		u.RawPath = ""
	}

	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		q = url.Values{}
	}
	base, _ := url.ParseQuery(u.RawQuery)
	q.Del("api-version")
	for k, vs := range base {
		for _, v := range vs {
			q.Add(k, v)
		}
	}
	if version != "v1" && q.Get("api-version") == "" {
		q.Set("api-version", version)
	}
	u.RawQuery = q.Encode()
	return u, nil
}

// setDeploymentHeaders adds d's extra headers where h has none of that name, then its credential:
// "api-key: <key>" for an Azure key, "Authorization: Bearer <key>" otherwise.
func setDeploymentHeaders(h http.Header, d config.Deployment) {
	for _, x := range d.ExtraHeaders {
		if h.Get(x.Name) == "" {
			h.Set(x.Name, x.Value)
		}
	}
	if d.APIKey == "" {
		return
	}
	if d.KeyHeader == config.KeyHeaderAzure {
		h.Set("Api-Key", d.APIKey)
		return
	}
	h.Set("Authorization", "Bearer "+d.APIKey)
}
