// Package config holds ciproxy's configuration: the YAML schema of the proxy's own sections
// (LiteLLM-compatible), os.environ/NAME references, validation with line numbers, and the file
// watcher. Each sandbox tool's parameters are handed to its backend to decode (SandboxBackend);
// internal/snapshot publishes a parsed Config together with the sandbox registry built from it.
//
// A *Config is immutable once parsed: a request loads it once and keeps that snapshot.
package config

import (
	"bytes"
	"slices"
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
	// Warnings are problems that do not stop the proxy (an os.environ/NAME that is not set, an open
	// proxy without master_key). They are printed at start, on reload and by --check.
	Warnings []string

	// raw is the file content this snapshot was parsed from (see SameSource).
	raw []byte
}

// Deployment is one model_list entry: a client-facing model name served by one upstream.
type Deployment struct {
	// ModelName is what clients send as "model".
	ModelName string
	// Provider is the part of litellm_params.model before the first "/" ("openai", "hosted_vllm", ...).
	Provider string
	// UpstreamModel is the part after the first "/": the model name sent upstream.
	UpstreamModel string
	// APIBase is the provider's base URL without a trailing slash, e.g. "https://api.openai.com/v1".
	APIBase string
	// APIKey is the resolved upstream key; "" means none is sent.
	APIKey string
	// MissingEnv names the os.environ variable that api_key (or api_base) referred to and that was not
	// set; the deployment then answers with an error naming it instead of calling upstream.
	MissingEnv string
	// Line is the line of the entry in the file, for messages.
	Line int
}

// SandboxTool is one sandbox_tools entry: a name, the backend that serves it, and that backend's
// settings. Config knows no backend's keys: Parse hands the rest of litellm_params to the backend
// named by sandbox_provider (see SandboxBackend), which decodes, checks and defaults them.
type SandboxTool struct {
	Name string // sandbox_tool_name
	// Provider is litellm_params.sandbox_provider: the backend's name ("local", "e2b").
	Provider string
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
	Enabled              bool          // default true
	EnabledProviders     []string      // nil: every provider; empty: none
	SandboxToolName      string        // default: the first sandbox tool
	FunctionName         string        // default "python"
	MaxIterations        int           // default 20
	ExecutionTimeout     time.Duration // default 120s
	ModelOutputLimit     int           // bytes of execution output the model sees, default 16384
	ContainerIdleTimeout time.Duration // default 20m; 0 deletes the sandbox when the request ends
}

// General is general_settings.
type General struct {
	// MasterKey is the key clients must send as "Authorization: Bearer ..."; "" means the proxy is open.
	// When master_key names an os.environ variable that is not set, MasterKey holds a random key that
	// nobody knows (so every request is refused rather than let through) and MissingEnv names the
	// variable.
	MasterKey          string
	MissingEnv         string
	ContainerSecret    string        // seals cntr_ ids (sandbox.KeyFromSecret); "" means a random key per process
	MaxRequestBodySize int64         // default 32 MiB
	ShutdownGrace      time.Duration // default 30s
	// DataDir holds the proxy's own state (Files API files, the container registry, stored
	// responses); "" means the default, chosen at start (/var/lib/ciproxy as root, else the user
	// cache directory). Read once at start: changing it needs a restart.
	DataDir              string
	MaxFileUploadSize    int64 // largest file POST /v1/files accepts, default 512 MiB
	MaxFileStoragePerKey int64 // total bytes of files one API key may store, default 10 GiB
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

// SameSource reports whether c was parsed from exactly data, so that a reload can tell a file that
// did not change.
func (c *Config) SameSource(data []byte) bool {
	return c.raw != nil && bytes.Equal(c.raw, data)
}
