package config

import (
	"regexp"
	"strings"
)

// provider is what this proxy knows of one LiteLLM provider prefix.
type provider struct {
	// base is the OpenAI-compatible base URL used when the deployment gives no api_base; "" when
	// it must give one.
	base string
	// api is the API the provider speaks for /v1/responses when model_info.supported_endpoints
	// does not say.
	api API
	// keyEnv are the variables LiteLLM reads the key from when api_key is absent, in order.
	keyEnv []string
	// baseEnv is the variable LiteLLM reads the base URL from when api_base is absent.
	baseEnv string
	// unusable says why the proxy cannot call the provider at all (its API is not OpenAI's, or its
	// credentials are not a static key); "" when it can.
	unusable string
	// noBase says why a deployment without api_base cannot be called, when base is "".
	noBase string
}

// Why a provider cannot be called.
const (
	notSigV4   = "calls AWS's native API with AWS SigV4 signing, which this proxy does not do (for Bedrock's OpenAI-compatible endpoint use openai/ with api_base https://bedrock-runtime.<region>.amazonaws.com/openai/v1 and a Bedrock API key)"
	notVertex  = "needs short-lived Google OAuth access tokens minted from service-account credentials, which this proxy does not do (for Gemini use gemini/ with a Gemini API key)"
	notWatsonx = "needs IBM IAM tokens exchanged from an API key, which this proxy does not do"
	notNative  = "speaks its own API, not OpenAI's; point openai/ (with api_base) at an OpenAI-compatible endpoint of it instead"
)

// providers are the provider prefixes this proxy knows. Any other prefix works with an api_base
// (an OpenAI-compatible server that speaks Chat Completions) and is unusable without one.
//
// The bases are the providers' documented OpenAI-compatible endpoints. Anthropic and Gemini are
// reached through their OpenAI compatibility layers (LiteLLM calls their native APIs instead).
// Which API each speaks: the providers whose own docs offer /v1/responses and whose LiteLLM
// integration (or this proxy's users) rely on it speak Responses; the rest Chat Completions. See
// docs/litellm-compat.md for the findings behind each default.
var providers = map[string]provider{
	"openai":                 {base: "https://api.openai.com/v1", api: APIResponses, keyEnv: []string{"OPENAI_API_KEY"}},
	"text-completion-openai": {base: "https://api.openai.com/v1", api: APIChatCompletions, keyEnv: []string{"OPENAI_API_KEY"}},
	"azure": {api: APIResponses, keyEnv: []string{"AZURE_OPENAI_API_KEY", "AZURE_API_KEY"}, baseEnv: "AZURE_API_BASE",
		noBase: "azure needs api_base (or the AZURE_API_BASE variable): the resource's endpoint, https://<resource>.openai.azure.com"},
	"openrouter": {base: "https://openrouter.ai/api/v1", api: APIResponses, keyEnv: []string{"OPENROUTER_API_KEY"}},
	"hosted_vllm": {api: APIResponses, keyEnv: []string{"HOSTED_VLLM_API_KEY"}, baseEnv: "HOSTED_VLLM_API_BASE",
		noBase: "hosted_vllm needs api_base (or the HOSTED_VLLM_API_BASE variable): the vLLM server's /v1 URL"},
	"ollama":       {base: "http://localhost:11434/v1", api: APIResponses},
	"ollama_chat":  {base: "http://localhost:11434/v1", api: APIResponses},
	"lm_studio":    {base: "http://localhost:1234/v1", api: APIResponses, keyEnv: []string{"LM_STUDIO_API_KEY"}},
	"xai":          {base: "https://api.x.ai/v1", api: APIResponses, keyEnv: []string{"XAI_API_KEY"}},
	"groq":         {base: "https://api.groq.com/openai/v1", api: APIResponses, keyEnv: []string{"GROQ_API_KEY"}},
	"fireworks_ai": {base: "https://api.fireworks.ai/inference/v1", api: APIResponses, keyEnv: []string{"FIREWORKS_API_KEY", "FIREWORKS_AI_API_KEY", "FIREWORKSAI_API_KEY", "FIREWORKS_AI_TOKEN"}},
	"litellm_proxy": {api: APIResponses, keyEnv: []string{"LITELLM_PROXY_API_KEY"}, baseEnv: "LITELLM_PROXY_API_BASE",
		noBase: "litellm_proxy needs api_base (or the LITELLM_PROXY_API_BASE variable)"},
	"mistral":     {base: "https://api.mistral.ai/v1", api: APIChatCompletions, keyEnv: []string{"MISTRAL_API_KEY"}},
	"codestral":   {base: "https://codestral.mistral.ai/v1", api: APIChatCompletions, keyEnv: []string{"CODESTRAL_API_KEY"}},
	"deepseek":    {base: "https://api.deepseek.com/v1", api: APIChatCompletions, keyEnv: []string{"DEEPSEEK_API_KEY"}},
	"together_ai": {base: "https://api.together.xyz/v1", api: APIChatCompletions, keyEnv: []string{"TOGETHERAI_API_KEY", "TOGETHER_API_KEY", "TOGETHER_AI_API_KEY", "TOGETHER_AI_TOKEN"}},
	"anthropic":   {base: "https://api.anthropic.com/v1", api: APIChatCompletions, keyEnv: []string{"ANTHROPIC_API_KEY"}},
	"gemini":      {base: "https://generativelanguage.googleapis.com/v1beta/openai", api: APIChatCompletions, keyEnv: []string{"GEMINI_API_KEY"}},
	"cohere":      {base: "https://api.cohere.ai/compatibility/v1", api: APIChatCompletions, keyEnv: []string{"COHERE_API_KEY"}},
	"perplexity":  {base: "https://api.perplexity.ai", api: APIChatCompletions, keyEnv: []string{"PERPLEXITYAI_API_KEY", "PERPLEXITY_API_KEY"}},
	"deepinfra":   {base: "https://api.deepinfra.com/v1/openai", api: APIChatCompletions, keyEnv: []string{"DEEPINFRA_API_KEY"}},
	"nvidia_nim":  {base: "https://integrate.api.nvidia.com/v1", api: APIChatCompletions, keyEnv: []string{"NVIDIA_NIM_API_KEY"}},
	"cerebras":    {base: "https://api.cerebras.ai/v1", api: APIChatCompletions, keyEnv: []string{"CEREBRAS_API_KEY"}},
	"sambanova":   {base: "https://api.sambanova.ai/v1", api: APIChatCompletions, keyEnv: []string{"SAMBANOVA_API_KEY"}},
	"huggingface": {api: APIChatCompletions, keyEnv: []string{"HF_TOKEN", "HUGGINGFACE_API_KEY"},
		noBase: "huggingface/ without api_base is Hugging Face's serverless Inference API, which is not OpenAI-compatible; set api_base to an OpenAI-compatible endpoint (an Inference Endpoint's /v1, or https://router.huggingface.co/v1)"},
	"databricks": {api: APIChatCompletions, keyEnv: []string{"DATABRICKS_API_KEY"}, baseEnv: "DATABRICKS_API_BASE",
		noBase: "databricks needs api_base (or the DATABRICKS_API_BASE variable): https://<workspace>/serving-endpoints"},

	"bedrock":        {unusable: notSigV4},
	"sagemaker":      {unusable: notSigV4},
	"sagemaker_chat": {unusable: notSigV4},
	"vertex_ai":      {unusable: notVertex},
	"vertex_ai_beta": {unusable: notVertex},
	"watsonx":        {unusable: notWatsonx},
	"watsonx_text":   {unusable: notWatsonx},
	"vllm":           {unusable: "runs the vLLM library inside LiteLLM's own process; for a vLLM server use hosted_vllm/ with api_base"},
	"replicate":      {unusable: notNative},
	"cloudflare":     {unusable: notNative},
	"ai21":           {unusable: notNative},
	"palm":           {unusable: notNative},
	"aleph_alpha":    {unusable: notNative},
	"nlp_cloud":      {unusable: notNative},
	"petals":         {unusable: notNative},
	"baseten":        {unusable: notNative},
	"predibase":      {unusable: notNative},
	"triton":         {unusable: notNative},
}

// KnownAPIBase returns the default api_base of an upstream provider, or "" when a deployment of
// that provider must set api_base itself. Only OpenAI-compatible endpoints whose address is fixed
// and documented by the provider are listed.
func KnownAPIBase(name string) string { return providers[name].base }

// DefaultAPI returns the API a deployment of the provider speaks for /v1/responses when its
// model_info.supported_endpoints does not say: Responses for the providers that offer it
// (openai, azure, openrouter, hosted_vllm, ollama, lm_studio, xai, groq, fireworks_ai,
// litellm_proxy), Chat Completions for every other one.
func DefaultAPI(name string) API {
	if p, ok := providers[name]; ok && p.api != "" {
		return p.api
	}
	return APIChatCompletions
}

// openAIModelRE matches the model names LiteLLM infers the openai provider for when model has no
// "provider/" prefix. LiteLLM decides from the OpenAI entries of its bundled price list; this is
// the documented pattern of those names: OpenAI's model families.
var openAIModelRE = regexp.MustCompile(`^(gpt-|chatgpt-|o[1-9](-|$)|codex-|computer-use-|text-embedding-|` +
	`omni-moderation-|text-moderation-|dall-e-|gpt-image-|tts-1|whisper-1$|davinci-002$|babbage-002$|ft:gpt-)`)

// InferProvider returns the provider LiteLLM infers for a model name without a "provider/" prefix:
// openai for OpenAI's model families (gpt-*, chatgpt-*, o1, o3*, o4-*, codex-*, text-embedding-*,
// dall-e-*, gpt-image-*, tts-1*, whisper-1, omni-moderation-*, ft:gpt-*, ...), anthropic for
// claude-*; "" for any other name.
func InferProvider(model string) string {
	switch {
	case openAIModelRE.MatchString(model):
		return "openai"
	case strings.HasPrefix(model, "claude-"):
		return "anthropic"
	}
	return ""
}
