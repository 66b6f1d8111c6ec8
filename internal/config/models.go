package config

import (
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ciproxy/ciproxy/internal/settings"
)

// environment reads environment_variables: LiteLLM sets them in its process at start. Here they
// take precedence over the environment for every os.environ/ reference and provider variable of
// this file; the process environment itself is left as it is.
func (d *decoder) environment(n *yaml.Node) {
	const path = "environment_variables"
	m := d.OpenMap(n, path, path)
	if len(m.Keys()) == 0 {
		return
	}
	vars := map[string]string{}
	for _, k := range m.Keys() {
		if v := m.String(k); v.Present {
			vars[k] = v.S
		}
	}
	d.Overlay(vars)
}

// credential is one credential_list entry.
type credential struct {
	values *yaml.Node // credential_values, a mapping
	index  int
}

// credentials reads credential_list: named sets of litellm_params values that a model_list entry
// takes by naming one in litellm_credential_name.
func (d *decoder) credentials(n *yaml.Node) map[string]credential {
	n = settings.Deref(n)
	if settings.IsNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.Errorf(n.Line, "credential_list must be a list")
		return nil
	}
	out := map[string]credential{}
	for i, item := range n.Content {
		item = settings.Deref(item)
		path := fmt.Sprintf("credential_list[%d]", i)
		e := d.section(item, secCredential, path, path, "credential_list[]")
		d.OpenMap(e.Node("credential_info"), path+".credential_info", path) // free-form metadata
		name := e.String("credential_name")
		if !name.Present || name.S == "" {
			if item.Kind == yaml.MappingNode && name.Env == "" {
				d.Errorf(item.Line, "%s: credential_name is required", path)
			}
			continue
		}
		if prev, dup := out[name.S]; dup {
			d.Errorf(e.ValueLine("credential_name"), "%s: %s is already the name of credential_list[%d]", e.Key("credential_name"), name.Shown(), prev.index)
			continue
		}
		values := e.Node("credential_values")
		// Checked here once for unknown and ignored keys; the values themselves are read, and
		// checked, by each deployment that takes them.
		d.section(values, secLiteLLMParams, path+".credential_values", path, "credential_list[].credential_values")
		if values != nil && values.Kind != yaml.MappingNode {
			continue
		}
		out[name.S] = credential{values: values, index: i}
	}
	return out
}

// withCredential returns the litellm_params mapping pn with the values of the credential it names
// (litellm_credential_name) added where pn has no such key: explicit litellm_params win, as in
// LiteLLM. Keys the vocabulary does not read are left out (credentials already reported them).
func (d *decoder) withCredential(pn *yaml.Node, path string, creds map[string]credential) *yaml.Node {
	if pn.Kind != yaml.MappingNode {
		return pn
	}
	var name *yaml.Node
	present := map[string]bool{}
	for i := 0; i+1 < len(pn.Content); i += 2 {
		present[pn.Content[i].Value] = true
		if pn.Content[i].Value == "litellm_credential_name" {
			name = settings.Deref(pn.Content[i+1])
		}
	}
	if name == nil || name.Kind != yaml.ScalarNode || settings.IsNull(name) {
		return pn // a wrong value is reported when the key is read
	}
	ref := name.Value
	if env, ok := strings.CutPrefix(ref, settings.EnvPrefix); ok {
		ref, ok = d.LookupEnv(env)
		if !ok {
			return pn
		}
	}
	c, ok := creds[ref]
	if !ok {
		d.Errorf(name.Line, "%s.litellm_credential_name: no credential_list entry is named %q", path, ref)
		return pn
	}
	if c.values == nil {
		return pn
	}
	readable, _ := sectionKeys(secLiteLLMParams)
	merged := *pn
	merged.Content = slices.Clone(pn.Content)
	for i := 0; i+1 < len(c.values.Content); i += 2 {
		k := c.values.Content[i].Value
		if !present[k] && slices.Contains(readable, k) {
			merged.Content = append(merged.Content, c.values.Content[i], c.values.Content[i+1])
			present[k] = true
		}
	}
	return &merged
}

func (d *decoder) models(n *yaml.Node, creds map[string]credential, def deploymentDefaults) []Deployment {
	n = settings.Deref(n)
	if settings.IsNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.Errorf(n.Line, "model_list must be a list")
		return nil
	}
	var out []Deployment
	for i, item := range n.Content {
		if dep, ok := d.deployment(i, settings.Deref(item), creds, def); ok {
			out = append(out, dep)
		}
	}
	return out
}

// deployment reads one model_list entry; false when it has no litellm_params to read.
func (d *decoder) deployment(i int, item *yaml.Node, creds map[string]credential, def deploymentDefaults) (Deployment, bool) {
	path := fmt.Sprintf("model_list[%d]", i)
	entry := d.section(item, secModel, path, path, "model_list[]")
	dep := Deployment{Line: item.Line}
	label := path
	name := entry.String("model_name")
	if name.Present {
		dep.ModelName = name.S
		label = fmt.Sprintf("%s (%s)", path, name.S)
	}
	if name.S == "" && name.Env == "" && item.Kind == yaml.MappingNode {
		d.Errorf(item.Line, "%s: model_name is required", path)
	}
	info := d.OpenMap(entry.Node("model_info"), path+".model_info", label)
	endpoints, haveEndpoints := info.StringList("supported_endpoints")
	at := toolsAt{label: label, line: item.Line}
	if tools, ok := hostedTools(info, "intercepted_tools"); ok {
		dep.InterceptedTools = tools
		at.given, at.line = true, info.ValueLine("intercepted_tools")
	}
	if d.toolsAt == nil {
		d.toolsAt = map[int]toolsAt{}
	}
	d.toolsAt[dep.Line] = at

	pn := entry.Node("litellm_params")
	if settings.IsNull(pn) {
		if item.Kind == yaml.MappingNode {
			d.Errorf(item.Line, "%s: litellm_params is required", path)
		}
		return dep, false
	}
	ppath := path + ".litellm_params"
	pn = d.withCredential(pn, ppath, creds)
	p := d.section(pn, secLiteLLMParams, ppath, label, "model_list[].litellm_params")
	if p.Has("litellm_credential_name") {
		p.String("litellm_credential_name") // its type is checked here; withCredential applied it
	}

	d.target(&dep, p, pn)
	prov := providers[dep.Provider]
	d.baseURL(&dep, p, prov)
	d.auth(&dep, p, prov)

	dep.Timeout = p.Duration("timeout", def.timeout, false)
	dep.StreamTimeout = p.Duration("stream_timeout", def.streamTimeout, false)
	if dep.StreamTimeout == 0 {
		dep.StreamTimeout = dep.Timeout
	}
	dep.StreamIdleTimeout = p.Duration("stream_idle_timeout", def.streamIdleTimeout, true)
	if def.numRetries >= 0 {
		dep.Attempts = def.numRetries + 1
	}

	dep.API = DefaultAPI(dep.Provider)
	if haveEndpoints && len(endpoints) > 0 {
		dep.API = APIChatCompletions
		if slices.Contains(endpoints, "/v1/responses") || slices.Contains(endpoints, "/responses") {
			dep.API = APIResponses
		}
	}
	if p.Bool("use_chat_completions_api", false) {
		dep.API = APIChatCompletions
	}

	d.requestParams(&dep, p)
	return dep, true
}

// target sets the provider and the upstream model from litellm_params model and
// custom_llm_provider, the way LiteLLM's get_llm_provider does.
func (d *decoder) target(dep *Deployment, p *settings.Map, pn *yaml.Node) {
	model := p.String("model")
	custom := p.String("custom_llm_provider")
	switch {
	case model.Present:
	case model.Env != "":
		dep.MissingEnv = model.Env
		return
	default:
		if pn.Kind == yaml.MappingNode {
			d.Errorf(pn.Line, "%s: model is required (provider/model, e.g. \"openai/gpt-4.1\")", p.Path())
		}
		return
	}
	prefix, rest, found := strings.Cut(model.S, "/")
	switch {
	case custom.Present && custom.S != "":
		dep.Provider = custom.S
		dep.UpstreamModel = model.S
		if found && prefix == custom.S {
			dep.UpstreamModel = rest
		}
	case found:
		if prefix == "" || rest == "" {
			d.Errorf(p.ValueLine("model"), "%s: %s must be provider/model, e.g. \"openai/gpt-4.1\"", p.Key("model"), model.Shown())
			return
		}
		dep.Provider, dep.UpstreamModel = prefix, rest
	default:
		dep.UpstreamModel = model.S
		dep.Provider = InferProvider(model.S)
		if dep.Provider == "" {
			dep.Unusable = fmt.Sprintf("model %q names no provider, and it is not an OpenAI or Anthropic model name that one is inferred for: write provider/model, e.g. \"hosted_vllm/%s\"", model.S, model.S)
			return
		}
	}
	if dep.UpstreamModel == "" {
		d.Errorf(p.ValueLine("model"), "%s: %s names no model", p.Key("model"), model.Shown())
		return
	}
	if strings.Contains(dep.UpstreamModel, "*") {
		dep.Unusable = "wildcard models (LiteLLM's \"*\" routing) are not supported: list each model in model_list"
	}
	if dep.Provider == "azure" {
		// LiteLLM's markers of how to call an Azure deployment; the deployment name follows them.
		for _, marker := range []string{"responses/", "o_series/"} {
			dep.UpstreamModel = strings.TrimPrefix(dep.UpstreamModel, marker)
		}
	}
	if prov, known := providers[dep.Provider]; known && prov.unusable != "" && dep.Unusable == "" {
		dep.Unusable = fmt.Sprintf("provider %s %s", dep.Provider, prov.unusable)
	}
}

// baseURL sets APIBase: api_base (or LiteLLM's alias base_url), else the provider's variable, else
// its known base. A deployment left without one is unusable.
func (d *decoder) baseURL(dep *Deployment, p *settings.Map, prov provider) {
	key := "api_base"
	if !p.Has(key) && p.Has("base_url") {
		key = "base_url"
	}
	base := p.String(key)
	switch {
	case base.Present:
		dep.APIBase = p.BaseURL(base, p.ValueLine(key), p.Key(key))
		return
	case base.Env != "":
		if dep.MissingEnv == "" {
			dep.MissingEnv = base.Env
		}
		dep.APIBase = prov.base
		return
	case dep.Provider == "":
		return
	}
	if prov.baseEnv != "" {
		if v, ok := d.LookupEnv(prov.baseEnv); ok && strings.TrimSpace(v) != "" {
			dep.APIBase = p.BaseURL(settings.Value{S: strings.TrimSpace(v), Env: prov.baseEnv, Present: true}, p.Line(), p.Path()+" ("+prov.baseEnv+")")
			return
		}
	}
	dep.APIBase = prov.base
	if dep.APIBase != "" || dep.Unusable != "" {
		return
	}
	if prov.noBase != "" {
		dep.Unusable = prov.noBase
	} else {
		dep.Unusable = fmt.Sprintf("provider %q has no known api_base: set api_base to the URL of its OpenAI-compatible API", dep.Provider)
	}
}

// auth sets APIKey and KeyHeader: api_key, else the provider's variables; for Azure, an
// api-key header, or azure_ad_token (or AZURE_AD_TOKEN) sent as a bearer token.
func (d *decoder) auth(dep *Deployment, p *settings.Map, prov provider) {
	key := p.String("api_key")
	dep.APIKey = key.S
	if key.Env != "" && !key.Present && dep.MissingEnv == "" {
		dep.MissingEnv = key.Env
	}
	if !p.Has("api_key") {
		for _, name := range prov.keyEnv {
			if v, ok := d.LookupEnv(name); ok && v != "" {
				dep.APIKey = v
				break
			}
		}
	}
	if org := p.String("organization"); org.Present && org.S != "" {
		dep.ExtraHeaders = append(dep.ExtraHeaders, Header{Name: "OpenAI-Organization", Value: org.S})
	}
	if dep.Provider != "azure" {
		return
	}
	version := p.String("api_version")
	dep.APIVersion = strings.TrimSpace(version.S)
	if !p.Has("api_version") {
		if v, ok := d.LookupEnv("AZURE_API_VERSION"); ok {
			dep.APIVersion = strings.TrimSpace(v)
		}
	}
	if dep.APIKey != "" {
		dep.KeyHeader = KeyHeaderAzure
		return
	}
	if key.Env != "" {
		return // MissingEnv says what is missing
	}
	token := p.String("azure_ad_token")
	switch {
	case token.Env != "" && !token.Present:
		if dep.MissingEnv == "" {
			dep.MissingEnv = token.Env
		}
		return
	case !p.Has("azure_ad_token"):
		if v, ok := d.LookupEnv("AZURE_AD_TOKEN"); ok && v != "" {
			token = settings.Value{S: v, Env: "AZURE_AD_TOKEN", Present: true}
		}
	}
	switch {
	case strings.HasPrefix(token.S, "oidc/"):
		if dep.Unusable == "" {
			dep.Unusable = "azure_ad_token oidc/... needs an OIDC token exchange, which this proxy does not do: set api_key, or azure_ad_token to an Entra ID access token"
		}
	case token.S != "":
		dep.APIKey = token.S // sent as "Authorization: Bearer <token>"
	case dep.Unusable == "" && dep.MissingEnv == "":
		dep.Unusable = "azure needs a credential: api_key (or the AZURE_OPENAI_API_KEY or AZURE_API_KEY variable), or azure_ad_token (or AZURE_AD_TOKEN); Entra ID sign-in with tenant_id, client_id and client_secret is not supported"
	}
}

// requestParams reads the default request parameters, extra_body and extra_headers.
func (d *decoder) requestParams(dep *Deployment, p *settings.Map) {
	for _, k := range p.Keys() {
		v, ok := lookupKey(secLiteLLMParams, k)
		if !ok || v.kind != param {
			continue
		}
		n := p.Node(k)
		if settings.IsNull(n) {
			continue
		}
		js := d.jsonValue(n, p.Key(k), p.Label(), k)
		if js == nil {
			continue
		}
		if !paramTypeOK(v.note, js) {
			d.Errorf(n.Line, "%s: must be %s", p.Key(k), typeName(v.note))
			continue
		}
		dep.Params = append(dep.Params, Param{Name: k, Value: js})
	}
	body := d.OpenMap(p.Node("extra_body"), p.Key("extra_body"), p.Label())
	for _, k := range body.Keys() {
		if k == "model" {
			d.Errorf(body.KeyLine(k), "%s: \"model\" is set by model_list, not extra_body", body.Path())
			continue
		}
		if js := d.jsonValue(body.Node(k), body.Key(k), p.Label(), "extra_body."+k); js != nil {
			dep.ExtraBody = append(dep.ExtraBody, Param{Name: k, Value: js})
		}
	}
	headers := d.OpenMap(p.Node("extra_headers"), p.Key("extra_headers"), p.Label())
	for _, k := range headers.Keys() {
		v := headers.String(k)
		switch {
		case !validHeaderName(k):
			d.Errorf(headers.KeyLine(k), "%s: %q is not a valid header name", headers.Path(), k)
		case !v.Present:
		case strings.ContainsAny(v.S, "\r\n\x00"):
			d.Errorf(headers.ValueLine(k), "%s: a header value must not hold line breaks or NUL", headers.Key(k))
		default:
			dep.ExtraHeaders = append(dep.ExtraHeaders, Header{Name: k, Value: v.S})
		}
	}
}

// validHeaderName reports whether s is an HTTP header name (an RFC 9110 token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// toolsAt is where a model_list entry's intercepted_tools are, for modelTools' messages.
type toolsAt struct {
	label string // "model_list[2] (gpt-4.1)"
	line  int    // of the value, else of the entry
	given bool   // the entry sets model_info.intercepted_tools
}

// modelTools checks model_info.intercepted_tools against the rest of the file, once
// code_interpreter_interception_params is read: the entries of one model_name must intercept the
// same tools (balancing and failover take any of them for a request already rewritten for its
// tools), and an entry whose provider enabled_providers leaves out intercepts nothing whatever it
// lists, which a warning says.
func (d *decoder) modelTools(cfg *Config) {
	first := map[string]int{} // model_name -> index in cfg.Models of its first entry
	for i, m := range cfg.Models {
		at := d.toolsAt[m.Line]
		if at.given && len(m.InterceptedTools) > 0 && !cfg.Interception.ProviderEnabled(m.Provider) {
			d.Warnf("%s.model_info.intercepted_tools lists %s, but enabled_providers leaves out its provider %q: the model intercepts nothing",
				at.label, strings.Join(m.InterceptedTools, ", "), m.Provider)
		}
		j, seen := first[m.ModelName]
		if !seen {
			first[m.ModelName] = i
			continue
		}
		o := cfg.Models[j]
		mine, theirs := cfg.Interception.ForModel(m.InterceptedTools).Tools, cfg.Interception.ForModel(o.InterceptedTools).Tools
		if sameTools(mine, theirs) {
			continue
		}
		d.Errorf(at.line, "%s: intercepts %s, but %s (line %d) intercepts %s: the entries of one model_name must intercept the same tools (model_info.intercepted_tools; absent: code_interpreter_interception_params.tools)",
			at.label, toolsShown(mine), d.toolsAt[o.Line].label, o.Line, toolsShown(theirs))
	}
}

// sameTools reports whether a and b hold the same tool names, in any order.
func sameTools(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// toolsShown is a list of tools for messages: "[code_interpreter, shell]", "[]" for none.
func toolsShown(tools []string) string {
	return "[" + strings.Join(tools, ", ") + "]"
}
