// Package config holds ciproxy's configuration: the YAML schema of the proxy's own sections
// (LiteLLM-compatible), os.environ/NAME references, validation with line numbers, and the file
// watcher. Each sandbox tool's parameters are handed to its backend to decode (SandboxBackend);
// internal/snapshot publishes a parsed Config together with the sandbox registry built from it.
//
// A *Config is immutable once parsed: a request loads it once and keeps that snapshot.
package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Config is one validated, immutable snapshot of the configuration file.
type Config struct {
	// Path is the file this snapshot was read from ("" when parsed from bytes).
	Path string
	// Models holds model_list in file order. Several entries may share a ModelName.
	Models []Deployment
	// SandboxTools holds sandbox_tools in file order.
	SandboxTools []SandboxTool
	// Callbacks is litellm_settings.callbacks.
	Callbacks []string
	// Interception is litellm_settings.code_interpreter_interception_params with defaults applied.
	Interception Interception
	// General is general_settings with defaults applied.
	General General
	// Router is what router_settings (and its fallbacks in litellm_settings) says that this proxy
	// honours: retries, timeouts and the Redis server.
	Router Router
	// Ignored lists the LiteLLM keys the file uses that this proxy knows but does not implement,
	// one entry per key with every line it is on (see the vocabulary in vocabulary.go).
	Ignored []IgnoredKey
	// Warnings are the other problems that do not stop the proxy (an os.environ/NAME that is not
	// set, an open proxy without master_key). AllWarnings adds the ignored keys and the unusable
	// deployments: that is what is printed at start, on reload and by --check.
	Warnings []string

	// raw is the file content this snapshot was parsed from (see SameSource).
	raw []byte
}

// Deployment is one model_list entry: a client-facing model name served by one upstream.
type Deployment struct {
	// ModelName is what clients send as "model".
	ModelName string
	// Provider is the part of litellm_params.model before the first "/" ("openai", "hosted_vllm",
	// ...), litellm_params.custom_llm_provider when set, or the provider inferred for a bare model
	// name (InferProvider).
	Provider string
	// UpstreamModel is the part after the first "/": the model name sent upstream. For Azure it is
	// the deployment name.
	UpstreamModel string
	// APIBase is the provider's base URL without a trailing slash, e.g. "https://api.openai.com/v1".
	// For Azure it is the resource's endpoint (https://NAME.openai.azure.com); the upstream client
	// adds Azure's paths.
	APIBase string
	// APIKey is the resolved upstream credential; "" means none is sent. It goes in the header
	// KeyHeader names.
	APIKey string
	// KeyHeader is the header APIKey is sent in: "" means "Authorization: Bearer <APIKey>" (every
	// OpenAI-compatible provider, and Azure's Entra ID token, azure_ad_token); KeyHeaderAzure means
	// Azure's "api-key: <APIKey>".
	KeyHeader string
	// APIVersion is Azure's api-version query value (litellm_params.api_version, else the
	// AZURE_API_VERSION variable, else "" for the upstream client's per-route default); "" for
	// every other provider.
	APIVersion string
	// API is the API the deployment speaks for /v1/responses: model_info.supported_endpoints when
	// the entry gives it, else the provider's default (DefaultAPI).
	API API
	// InterceptedTools is model_info.intercepted_tools: the hosted tools the proxy runs itself for
	// this model, in place of Interception.Tools (Interception.ForModel). nil: the entry does not say,
	// Interception.Tools applies; empty: none, every hosted tool passes through as sent. The
	// entries of one model_name agree on it (Parse checks).
	InterceptedTools []string
	// Params are the default request parameters of litellm_params (temperature, max_tokens, seed,
	// ...), in Chat Completions names and file order, each value as JSON. A client's own value for
	// a parameter wins; internal/upstream applies them (and maps them for the Responses API).
	Params []Param
	// ExtraBody is litellm_params.extra_body: keys merged into the top level of each JSON request
	// body where the client did not set them.
	ExtraBody []Param
	// ExtraHeaders are litellm_params.extra_headers (and organization, as OpenAI-Organization),
	// sent with every request where the client did not set them, in file order.
	ExtraHeaders []Header
	// Timeout bounds the wait for an upstream's response headers, per attempt (litellm_params
	// timeout, else router_settings.timeout, else litellm_settings.request_timeout); 0: no bound.
	// StreamTimeout is the same for "stream": true requests (stream_timeout, falling back the same
	// way, then to Timeout).
	Timeout, StreamTimeout time.Duration
	// StreamIdleTimeout bounds the wait for the next bytes of an upstream's body once its headers
	// came, per read (litellm_params stream_idle_timeout, else router_settings', else
	// DefaultStreamIdleTimeout); 0: no bound. LiteLLM's stream_timeout is the header wait here.
	StreamIdleTimeout time.Duration
	// Attempts is how many upstream calls a request that starts at this deployment may make across
	// its model's deployments, in turn (router_settings.num_retries + 1); 0 means each deployment
	// once.
	Attempts int
	// MissingEnv names the os.environ variable that api_key (or api_base) referred to and that was not
	// set; the deployment then answers with an error naming it instead of calling upstream.
	MissingEnv string
	// Unusable says why the proxy cannot call this deployment (a provider that is not
	// OpenAI-compatible, a base URL missing, ...); "" when it can. Such an entry still loads, with a
	// warning: requests for its model go to the model's other deployments, and fail with an error
	// saying this when there is none.
	Unusable string
	// Line is the line of the entry in the file, for messages.
	Line int
}

// Callable reports whether the proxy can call d: nothing it needs is missing and its provider is
// one it speaks to.
func (d Deployment) Callable() bool { return d.MissingEnv == "" && d.Unusable == "" }

// KeyHeaderAzure is Deployment.KeyHeader for an Azure OpenAI key.
const KeyHeaderAzure = "api-key"

// API is an OpenAI API a deployment speaks for /v1/responses.
type API string

const (
	// APIResponses is OpenAI's Responses API: /v1/responses goes to the upstream as it is.
	APIResponses API = "responses"
	// APIChatCompletions is Chat Completions only: /v1/responses must be translated.
	APIChatCompletions API = "chat_completions"
)

// Param is one default request parameter (or extra_body key) and its value as JSON.
type Param struct {
	Name  string
	Value json.RawMessage
}

// Header is one extra header sent upstream.
type Header struct {
	Name, Value string
}

// Router holds the router_settings this proxy honours.
type Router struct {
	// Redis is the Redis server that replicas share (redis_host, redis_port, redis_password,
	// redis_url, redis_db); the zero value means none is configured.
	Redis Redis
}

// Redis is router_settings' Redis server, as LiteLLM writes it: a URL, or host, port and password.
// Every field may come from os.environ/NAME.
type Redis struct {
	// URL is redis_url (redis://, rediss:// or unix://); when set, it is what to connect to, and
	// Host and Port are not used (a warning says so when both are given). It may hold the
	// password: never log it.
	URL string
	// Host and Port are redis_host and redis_port; Port is DefaultRedisPort when only the host is
	// given.
	Host string
	Port int
	// Password is redis_password; "" means none.
	Password string
	// DB is redis_db, the database number; 0 by default.
	DB int
}

// DefaultRedisPort is Redis's own port, used when router_settings has redis_host but no redis_port.
const DefaultRedisPort = 6379

// Configured reports whether a Redis server is configured.
func (r Redis) Configured() bool { return r.URL != "" || r.Host != "" }

// Addr is "host:port" for a server given by host and port; "" when it is given by URL or not at all.
func (r Redis) Addr() string {
	if r.Host == "" {
		return ""
	}
	return fmt.Sprintf("%s:%d", r.Host, r.Port)
}

// IgnoredKey is a LiteLLM key that this proxy accepts without implementing it.
type IgnoredKey struct {
	// Key is the key's place in the file: "router_settings.routing_strategy", or
	// "model_list[].litellm_params.rpm" for a key of every model_list entry.
	Key string
	// Lines are the lines it is on, in order.
	Lines []int
	// Reason says what LiteLLM does with the key and what this proxy does instead.
	Reason string
}

// String is the warning: "ignored: router_settings.routing_strategy (line 12), LiteLLM's ...".
func (k IgnoredKey) String() string {
	lines := make([]string, len(k.Lines))
	for i, l := range k.Lines {
		lines[i] = fmt.Sprint(l)
	}
	word := "line"
	if len(lines) > 1 {
		word = "lines"
	}
	return fmt.Sprintf("ignored: %s (%s %s), %s", k.Key, word, strings.Join(lines, ", "), k.Reason)
}

// Name identifies a deployment in messages, without its key: "provider/upstream-model".
func (d Deployment) Name() string {
	switch {
	case d.Provider == "":
		return d.UpstreamModel
	case d.UpstreamModel == "":
		return d.Provider + "/"
	}
	return d.Provider + "/" + d.UpstreamModel
}

// SandboxTool is one sandbox_tools entry: a name, the backend that serves it, and that backend's
// settings. Config knows no backend's keys: Parse hands the rest of litellm_params to the backend
// named by sandbox_provider (see SandboxBackend), which decodes, checks and defaults them.
type SandboxTool struct {
	Name string // sandbox_tool_name
	// Backend is litellm_params.sandbox_provider: the backend's name ("local", "e2b").
	Backend string
	// Settings is what the backend's Decode returned for the rest of litellm_params, every default
	// applied (for internal/sandbox's backends, a sandbox.Provisioner). nil when the file was parsed
	// without that backend.
	Settings any
	// Line is the line of the entry in the file; 0 for the implicit "local" tool that stands in when
	// sandbox_tools is absent.
	Line int
}

// Interception is code_interpreter_interception_params.
type Interception struct {
	Enabled          bool     // default true
	EnabledProviders []string // nil: every provider; empty: none
	SandboxToolName  string   // default: the first sandbox tool
	FunctionName     string   // default "python"
	// Tools are the hosted tools the proxy runs itself: "code_interpreter" and "shell" (nil, as
	// in a Config built in code: both). A request's other hosted tools pass as sent.
	Tools []string
	// The function that stands in for the shell tool towards the model (default "shell"), and
	// its description ("": the built-in one).
	ShellFunctionName        string
	ShellFunctionDescription string
	MaxIterations            int           // default 20
	ExecutionTimeout         time.Duration // default 120s
	ModelOutputLimit         int           // bytes of execution output the model sees, default 16384
	ContainerIdleTimeout     time.Duration // default 20m; 0 deletes the sandbox when the request ends
	// KernelIdleTimeout is how long a container's kernel may stay unused before it is restarted,
	// giving back the memory of its Python state and keeping its files (local tools); default 5m;
	// 0: never.
	KernelIdleTimeout time.Duration

	// Limits of one response (quotas.go): stand-in calls run per model turn, executions per
	// response (max_tool_calls lowers it), bytes of one call's code, and bytes of execution output
	// summed over the response.
	MaxCallsPerTurn   int   // default 16
	MaxExecutions     int   // default 64
	MaxCodeSize       int   // default 1 MiB
	MaxResponseOutput int64 // default 32 MiB
}

// HostedTools are the hosted tools the proxy can run itself.
var HostedTools = []string{"code_interpreter", "shell"}

// Intercepts reports whether the proxy runs the hosted tool named typ itself.
func (in Interception) Intercepts(typ string) bool {
	if in.Tools == nil {
		return slices.Contains(HostedTools, typ)
	}
	return slices.Contains(in.Tools, typ)
}

// ForModel returns the interception settings of a request for a model whose entry says tools
// (its Deployment.InterceptedTools): in itself, with Tools replaced by tools unless that is nil.
// Interception must still apply to the request (InterceptionActive, ProviderEnabled) for any tool
// to be run.
func (in Interception) ForModel(tools []string) Interception {
	if tools != nil {
		in.Tools = tools
	}
	return in
}

// General is general_settings.
type General struct {
	// MasterKey is the key clients must send as "Authorization: Bearer ..."; "" means the proxy is open.
	// When master_key names an os.environ variable that is not set, MasterKey holds a random key that
	// nobody knows (so every request is refused rather than let through) and MissingEnv names the
	// variable.
	MasterKey  string
	MissingEnv string
	// ContainerSecret is the secret the replicas of one deployment share: it authenticates the
	// requests they forward to each other and tags their sandboxes. When the file sets none,
	// replicas sharing Redis agree on one through it (ParseOptions.SharedSecret); "" otherwise.
	ContainerSecret    string
	MaxRequestBodySize int64         // default 32 MiB
	ShutdownGrace      time.Duration // default 30s
	// DataDir holds the proxy's own state (Files API files, the container registry, stored
	// responses); "" means the default, chosen at start (/var/lib/ciproxy as root, else the user
	// cache directory). Read once at start: changing it needs a restart.
	DataDir              string
	MaxFileUploadSize    int64 // largest file POST /v1/files accepts, default 512 MiB
	MaxFileStoragePerKey int64 // total bytes of files one API key may store, default 10 GiB
	// MaxInlineBytesInFlight and MaxInlineBytesInFlightPerKey bound the bytes of stored files
	// that requests in flight inline by file_id, in all and per key (default 512 MiB and 128 MiB;
	// 0 in a Config built in code: no bound).
	MaxInlineBytesInFlight       int64
	MaxInlineBytesInFlightPerKey int64
	// Uploads in flight (Files API): how many one key may have at once (default 16), how many
	// bytes every key's may hold together (default 2 GiB: in this process's data directory, or
	// in Redis for every replica), and how long one upload's body may take (default 15m).
	MaxConcurrentUploadsPerKey int
	MaxUploadBytesInFlight     int64
	UploadTimeout              time.Duration
	// Quotas are the quotas of every caller without a client_keys entry of its own (the master
	// key's, an open proxy's callers), and the totals.
	Quotas Quotas
	// ClientKeys are general_settings.client_keys: keys accepted besides MasterKey, each the owner
	// named by its Name. Only digests of the keys are kept.
	ClientKeys []ClientKey
	// AdvertiseURL is the base URL (http or https, host and port, no path) at which the other
	// replicas reach this one, for the requests they forward to it; "" means derived from the
	// listen address when that is a specific one. Read once at start.
	AdvertiseURL string
}

// ProviderEnabled reports whether interception applies to deployments of provider: EnabledProviders
// nil means every provider, an empty list means none.
func (i Interception) ProviderEnabled(provider string) bool {
	if i.EnabledProviders == nil {
		return true
	}
	return slices.Contains(i.EnabledProviders, provider)
}

// InterceptionActive reports whether code_interpreter_interception is listed in callbacks and enabled.
func (c *Config) InterceptionActive() bool {
	if !c.Interception.Enabled {
		return false
	}
	for _, cb := range c.Callbacks {
		if cb == "code_interpreter_interception" {
			return true
		}
	}
	return false
}

// SandboxTool returns the tool with the given name.
func (c *Config) SandboxTool(name string) (SandboxTool, bool) {
	for _, t := range c.SandboxTools {
		if t.Name == name {
			return t, true
		}
	}
	return SandboxTool{}, false
}

// Deployments returns the entries serving modelName, in file order.
func (c *Config) Deployments(modelName string) []Deployment {
	var out []Deployment
	for _, d := range c.Models {
		if d.ModelName == modelName {
			out = append(out, d)
		}
	}
	return out
}

// Unusable returns the deployments the proxy cannot call, in file order.
func (c *Config) Unusable() []Deployment {
	var out []Deployment
	for _, d := range c.Models {
		if d.Unusable != "" {
			out = append(out, d)
		}
	}
	return out
}

// AllWarnings returns every warning of the file, one line each, as the proxy prints them at start,
// on reload and in --check: the ignored LiteLLM keys, the unusable deployments, then the rest.
func (c *Config) AllWarnings() []string {
	out := make([]string, 0, len(c.Ignored)+len(c.Warnings))
	for _, k := range c.Ignored {
		out = append(out, k.String())
	}
	out = append(out, c.UnusableWarnings()...)
	return append(out, c.Warnings...)
}

// UnusableWarnings returns a warning for each deployment the proxy cannot call, in file order:
// which entry, why, and what then happens to requests for its model.
func (c *Config) UnusableWarnings() []string {
	var out []string
	for _, d := range c.Unusable() {
		then := fmt.Sprintf("requests for %q get an error saying so", d.ModelName)
		if slices.ContainsFunc(c.Models, func(o Deployment) bool { return o.ModelName == d.ModelName && o.Unusable == "" }) {
			then = fmt.Sprintf("the other deployments of %q serve", d.ModelName)
		}
		out = append(out, fmt.Sprintf("unusable: model_list entry %q at line %d (%s): %s; %s", d.ModelName, d.Line, d.Name(), d.Unusable, then))
	}
	return out
}

// SameSource reports whether c was parsed from exactly data, so that a reload can tell a file that
// did not change.
func (c *Config) SameSource(data []byte) bool {
	return c.raw != nil && bytes.Equal(c.raw, data)
}
