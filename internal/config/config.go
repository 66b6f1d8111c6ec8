// Package config holds ciproxy's configuration: the YAML schema (LiteLLM-compatible), os.environ/NAME
// references, validation with line numbers, and the Store that hot reload publishes through.
//
// A *Config is immutable once published: a request loads it once and keeps that snapshot.
package config

import (
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

	// raw is the file content this snapshot was parsed from; the watcher compares it with the file so
	// that an event that changed nothing reloads nothing.
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

// SandboxTool is one sandbox_tools entry.
type SandboxTool struct {
	Name     string // sandbox_tool_name
	Provider string // litellm_params.sandbox_provider: "local" or "e2b"

	// e2b settings. Empty values fall back to E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN.
	APIKey              string
	APIBase             string        // control plane, default https://api.<domain>
	Domain              string        // default e2b.app
	SandboxURL          string        // one data-plane base URL, routed by E2b-Sandbox-Id/-Port headers
	Template            string        // default code-interpreter-v1
	Timeout             time.Duration // sandbox lifetime asked at create, default 300s
	AllowInternetAccess bool          // default false
	MissingEnv          string        // as Deployment.MissingEnv

	// local settings.
	Python       string // interpreter inside the sandbox, default /usr/bin/python3
	MemoryLimit  string // default per-sandbox memory, "1g"
	MaxMemory    string // the largest memory_limit a request may ask for, default "4g"
	MaxProcesses int    // default 64
	MaxFileSize  string // largest file a sandbox may write, default "100m"
	MaxDiskSize  string // working-directory size limit, default "512m"
	PoolSize     int    // warm kernels kept started, default 2
	WorkDir      string // parent of the per-sandbox directories, default os.TempDir()/ciproxy-sandboxes

	// The size settings above in bytes (binary units: "1g" is 1<<30), parsed and validated.
	MemoryLimitBytes int64
	MaxMemoryBytes   int64
	MaxFileSizeBytes int64
	MaxDiskSizeBytes int64

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
