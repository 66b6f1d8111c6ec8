package config

import (
	"slices"
	"strings"
	"testing"
)

// TestVocabularyIsConsistent: each section lists a key once, every ignored key says why, and every
// default request param has a type paramTypeOK knows.
func TestVocabularyIsConsistent(t *testing.T) {
	types := []string{"number", "integer", "boolean", "string", "list", "mapping", "string or list", "string or mapping"}
	for section, keys := range vocabulary {
		seen := map[string]bool{}
		for _, k := range keys {
			if seen[k.key] {
				t.Errorf("%q: key %q listed twice", section, k.key)
			}
			seen[k.key] = true
			switch k.kind {
			case ignore:
				if len(k.note) < 20 || !strings.Contains(k.note, ";") && !strings.Contains(k.note, "not implemented") {
					t.Errorf("%q.%s: reason %q does not say what LiteLLM does and what this proxy does instead", section, k.key, k.note)
				}
			case param:
				if section != secLiteLLMParams || !slices.Contains(types, k.note) {
					t.Errorf("%q.%s: a param must be in litellm_params with a known type, not %q", section, k.key, k.note)
				}
			case read:
				if k.note != "" {
					t.Errorf("%q.%s: an honoured key has no reason", section, k.key)
				}
			default:
				t.Errorf("%q.%s: no kind", section, k.key)
			}
		}
	}
}

func TestInferProvider(t *testing.T) {
	for model, want := range map[string]string{
		"gpt-4o": "openai", "gpt-4.1-mini": "openai", "gpt-3.5-turbo-instruct": "openai", "chatgpt-4o-latest": "openai",
		"o1": "openai", "o1-pro": "openai", "o3": "openai", "o3-mini": "openai", "o4-mini": "openai", "codex-mini-latest": "openai",
		"text-embedding-3-small": "openai", "dall-e-3": "openai", "gpt-image-1": "openai", "tts-1-hd": "openai", "whisper-1": "openai",
		"omni-moderation-latest": "openai", "ft:gpt-4o-mini:org::abc": "openai", "computer-use-preview": "openai",
		"claude-3-5-sonnet-20240620": "anthropic", "claude-sonnet-4-5": "anthropic",
		"o10x": "", "llama3.1": "", "gemini-2.5-pro": "", "mistral-large": "", "gpt4": "", "whisper-large-v3": "",
	} {
		if got := InferProvider(model); got != want {
			t.Errorf("InferProvider(%q) = %q; want %q", model, got, want)
		}
	}
}

func TestDefaultAPI(t *testing.T) {
	for provider, want := range map[string]API{
		"openai": APIResponses, "azure": APIResponses, "openrouter": APIResponses, "hosted_vllm": APIResponses,
		"ollama": APIResponses, "lm_studio": APIResponses, "xai": APIResponses, "groq": APIResponses, "fireworks_ai": APIResponses,
		"deepseek": APIChatCompletions, "mistral": APIChatCompletions, "together_ai": APIChatCompletions,
		"anthropic": APIChatCompletions, "gemini": APIChatCompletions, "my_server": APIChatCompletions, "bedrock": APIChatCompletions,
	} {
		if got := DefaultAPI(provider); got != want {
			t.Errorf("DefaultAPI(%q) = %q; want %q", provider, got, want)
		}
	}
	for provider, want := range map[string]string{
		"anthropic": "https://api.anthropic.com/v1",
		"gemini":    "https://generativelanguage.googleapis.com/v1beta/openai",
		"azure":     "", "bedrock": "",
	} {
		if got := KnownAPIBase(provider); got != want {
			t.Errorf("KnownAPIBase(%q) = %q; want %q", provider, got, want)
		}
	}
}

func TestRedis(t *testing.T) {
	cases := []struct {
		r          Redis
		configured bool
		addr       string
	}{
		{Redis{}, false, ""},
		{Redis{Host: "redis", Port: 6380}, true, "redis:6380"},
		{Redis{URL: "rediss://redis:6380/1"}, true, ""},
	}
	for _, c := range cases {
		if c.r.Configured() != c.configured || c.r.Addr() != c.addr {
			t.Errorf("%+v: Configured %v, Addr %q; want %v, %q", c.r, c.r.Configured(), c.r.Addr(), c.configured, c.addr)
		}
	}
}
