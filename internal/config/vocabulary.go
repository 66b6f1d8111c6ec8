package config

// The vocabulary: every key of a LiteLLM proxy config that this proxy knows, section by section,
// and what it does with each. A key is one of three kinds:
//
//   - honoured (read): the proxy reads it and acts on it;
//   - a default request parameter (param, litellm_params only): honoured, sent upstream where the
//     client did not set it;
//   - ignored: one of LiteLLM's keys that this proxy accepts without implementing it; each one the
//     file uses is named once in a warning, with the reason given here;
//
// and any key that is in none of these lists is an error with its line, so that a misspelt key
// (of the proxy's own or of LiteLLM's) never goes unnoticed.
//
// Source: LiteLLM's proxy documentation, "All settings" (docs/my-website/docs/proxy/config_settings.md
// at BerriAI/litellm commit 00670428e1ec49f6f79eee1e58df7be472b719ab, a v1.8x text of 2026), with
// configs.md (00907c60692d7d14dc7ea814e645165d3b4d5fe9), load_balancing.md, reliability.md and the
// pydantic shapes of litellm_params and model_info in litellm/types/router.py
// (0044fbecee0c76affc468f39b4f29da782eb4961). docs/litellm-compat.md summarises it.
//
// Sections where LiteLLM itself takes any key stay open here too: model_list[].model_info (LiteLLM
// metadata, pydantic extra="allow"), environment_variables and credential_info. In litellm_settings
// LiteLLM sets any key as an attribute of its module, unchecked; this proxy lists the documented
// ones and keeps the rest an error, since a typo there would otherwise pass silently.

// keyKind is what the proxy does with a key.
type keyKind uint8

const (
	read   keyKind = iota + 1 // honoured
	param                     // a default request parameter (litellm_params)
	ignore                    // accepted, named once in a warning
)

// vocabKey is one key of a section.
type vocabKey struct {
	key  string
	kind keyKind
	// note is, for an ignored key, what LiteLLM does with it and what this proxy does instead; for
	// a param, the JSON type its value must have (see paramTypes).
	note string
}

// Sections of the vocabulary.
const (
	secTop             = ""
	secModel           = "model_list[]"
	secLiteLLMParams   = "litellm_params" // model_list[].litellm_params and credential_values
	secLiteLLMSettings = "litellm_settings"
	secGeneral         = "general_settings"
	secRouter          = "router_settings"
	secCredential      = "credential_list[]"
)

// Reasons shared by several keys.
const (
	whyRouting     = "LiteLLM's load-balancing strategy; this proxy balances round-robin"
	whyLimits      = "LiteLLM's rate limits and deployment weights; this proxy does not rate-limit and balances round-robin"
	whyFallbacks   = "LiteLLM's fallbacks to other model groups; this proxy fails over only between the deployments of one model_name"
	whyCooldown    = "LiteLLM's deployment cooldown; this proxy tries a model's deployments in turn on every request"
	whyRetryPolicy = "LiteLLM's per-error retry policy; this proxy retries connection errors, timeouts and 5xx (num_retries)"
	whyCache       = "LiteLLM's response cache; this proxy does not cache responses"
	whyLogging     = "LiteLLM's logging integrations; this proxy logs to stderr and serves Prometheus metrics at /metrics"
	whyAlerting    = "LiteLLM's alerting (Slack, email, webhooks); this proxy logs and serves Prometheus metrics"
	whyDB          = "LiteLLM's database (virtual keys, spend, teams); this proxy keeps no database"
	whyAuth        = "LiteLLM's virtual keys, SSO and JWT auth; this proxy authenticates clients with master_key"
	whyBudget      = "LiteLLM's spend tracking and budgets; this proxy tracks no spend"
	whyCost        = "LiteLLM's cost tracking; this proxy tracks no cost"
	whyGuardrails  = "LiteLLM's guardrails; not implemented"
	whySecrets     = "LiteLLM's secret managers; this proxy reads keys from the file and os.environ/ only"
	whyHealth      = "LiteLLM's background health checks; this proxy fails over when a call fails"
	whyDebug       = "LiteLLM's debug logging; this proxy logs at info level"
	whyParams      = "LiteLLM's rewriting of params a provider does not take; this proxy sends the client's params as they are"
	whyTags        = "LiteLLM's tag-based routing; this proxy routes by model_name only"
	whyPreCall     = "LiteLLM's pre-call checks (context window, region); this proxy sends every request to the deployment in turn"
	whyAlias       = "LiteLLM's model group aliases; clients must send a model_name of model_list"
	whyMCP         = "LiteLLM's MCP gateway; not implemented"
	whyPrompts     = "LiteLLM's prompt management; not implemented"
	whyAgents      = "LiteLLM's agent and vector-store registries; not implemented"
	whyPassThrough = "LiteLLM's provider pass-through routes; this proxy serves the OpenAI routes only"
	whyUI          = "LiteLLM's admin UI; this proxy has none"
	whyDefaults    = "LiteLLM's default models that replace the request's; this proxy serves the model the client names"
	whyParallel    = "LiteLLM's concurrency limits; this proxy does not limit concurrency per deployment"
	whyClientAuth  = "LiteLLM's client-side credentials; this proxy never lets a client choose the upstream or its key"
	whyAWS         = "AWS credentials for LiteLLM's Bedrock and SageMaker calls; this proxy does not sign AWS requests"
	whyVertex      = "Google Vertex AI credentials; this proxy does not mint Google access tokens"
	whyEntra       = "Azure Entra ID sign-in for LiteLLM to mint tokens; this proxy does not mint Entra tokens: set api_key or azure_ad_token"
	whyTemplate    = "LiteLLM's prompt templates for raw text-completion models; this proxy sends chat requests to OpenAI-compatible servers as they are"
	whyMock        = "LiteLLM's mock responses for tests; this proxy always calls the upstream"
	whyAutoRouter  = "LiteLLM's auto-router; not implemented"
	whyRegion      = "LiteLLM's region tag for pre-call region filtering; not implemented"
	whyRetries     = "LiteLLM's retries inside one deployment's client; this proxy retries across deployments (router_settings.num_retries)"
	whyKeepalive   = "LiteLLM's stream keep-alives; this proxy passes the upstream's stream through as it comes"
	whyFiles       = "LiteLLM's file, batch and fine-tuning storage; not implemented"
	whyInclude     = "LiteLLM merges the listed files into this one; this proxy reads this file only, so what they hold is not served"
	whyTopLevel    = "LiteLLM reads it from router_settings or litellm_settings and ignores it at the top level; so does this proxy"
	whyEnterprise  = "a LiteLLM Enterprise feature; not implemented"
	whyProxyRoute  = "LiteLLM's routing through another LiteLLM proxy or pass-through endpoint; this proxy calls the upstream directly"
	whyAffinity    = "LiteLLM's deployment affinity; this proxy balances round-robin"
	whyScheduler   = "LiteLLM's request priority queue; not implemented"
	whyClientTTL   = "LiteLLM's cached HTTP client lifetime; this proxy keeps one pooled client"
	whyPlain       = "LiteLLM's per-key ciphering of response ids; this proxy seals its own ids"
	whySearch      = "LiteLLM's search-tool and guardrail deployments; not implemented"
	whyModelInfo   = "LiteLLM's internal model_info copy; model_info beside litellm_params is read instead"
)

// vocabulary lists each section's keys. Lists of ignored keys are grouped by topic.
var vocabulary = map[string][]vocabKey{
	secTop: {
		{"model_list", read, ""},
		{"sandbox_tools", read, ""}, // ciproxy's own (and LiteLLM's sandbox docs)
		{"litellm_settings", read, ""},
		{"general_settings", read, ""},
		{"router_settings", read, ""},
		{"environment_variables", read, ""},
		{"credential_list", read, ""},
		{"include", ignore, whyInclude},
		{"callback_settings", ignore, whyLogging},
		{"guardrails", ignore, whyGuardrails},
		{"assistant_settings", ignore, "LiteLLM's Assistants API settings; not implemented"},
		{"search_tools", ignore, whySearch},
		{"finetune_settings", ignore, whyFiles},
		{"files_settings", ignore, whyFiles},
		{"default_vertex_config", ignore, whyVertex},
		{"prompts", ignore, whyPrompts},
		{"policies", ignore, whyGuardrails},
		{"policy_attachments", ignore, whyGuardrails},
		{"mcp_servers", ignore, whyMCP},
		{"mcp_tools", ignore, whyMCP},
		{"agent_list", ignore, whyAgents},
		{"vector_store_registry", ignore, whyAgents},
		{"fallbacks", ignore, whyTopLevel},
		{"context_window_fallbacks", ignore, whyTopLevel},
		{"content_policy_fallbacks", ignore, whyTopLevel},
		{"allowed_fails", ignore, whyTopLevel},
	},
	secModel: {
		{"model_name", read, ""},
		{"litellm_params", read, ""},
		{"model_info", read, ""}, // open: any key, supported_endpoints honoured
		// Where one of LiteLLM's docs puts them; its proxy reads them here as in litellm_params.
		{"rpm", ignore, whyLimits},
		{"tpm", ignore, whyLimits},
	},
	secLiteLLMParams: {
		// Where and how to call the deployment.
		{"model", read, ""},
		{"api_key", read, ""},
		{"api_base", read, ""},
		{"base_url", read, ""}, // LiteLLM's alias of api_base
		{"api_version", read, ""},
		{"azure_ad_token", read, ""},
		{"custom_llm_provider", read, ""},
		{"litellm_credential_name", read, ""},
		{"organization", read, ""},
		{"timeout", read, ""},
		{"stream_timeout", read, ""},
		{"stream_idle_timeout", read, ""},
		{"extra_headers", read, ""},
		{"extra_body", read, ""},
		{"use_chat_completions_api", read, ""},
		// Default request parameters (OpenAI Chat Completions names), and the sampling
		// parameters that OpenAI-compatible servers such as vLLM and llama.cpp take besides.
		{"temperature", param, "number"},
		{"top_p", param, "number"},
		{"n", param, "integer"},
		{"stop", param, "string or list"},
		{"max_tokens", param, "integer"},
		{"max_completion_tokens", param, "integer"},
		{"presence_penalty", param, "number"},
		{"frequency_penalty", param, "number"},
		{"logit_bias", param, "mapping"},
		{"user", param, "string"},
		{"response_format", param, "mapping"},
		{"seed", param, "integer"},
		{"tools", param, "list"},
		{"tool_choice", param, "string or mapping"},
		{"parallel_tool_calls", param, "boolean"},
		{"logprobs", param, "boolean"},
		{"top_logprobs", param, "integer"},
		{"stream_options", param, "mapping"},
		{"reasoning_effort", param, "string"},
		{"verbosity", param, "string"},
		{"functions", param, "list"},
		{"function_call", param, "string or mapping"},
		{"modalities", param, "list"},
		{"audio", param, "mapping"},
		{"prediction", param, "mapping"},
		{"service_tier", param, "string"},
		{"store", param, "boolean"},
		{"metadata", param, "mapping"},
		{"web_search_options", param, "mapping"},
		{"top_k", param, "integer"},
		{"min_p", param, "number"},
		{"repetition_penalty", param, "number"},
		// Load balancing and limits.
		{"rpm", ignore, whyLimits},
		{"tpm", ignore, whyLimits},
		{"itpm", ignore, whyLimits},
		{"otpm", ignore, whyLimits},
		{"weight", ignore, whyLimits},
		{"order", ignore, "LiteLLM's deployment priority (lower order first); this proxy balances round-robin over every deployment of a model"},
		{"max_parallel_requests", ignore, whyParallel},
		{"cooldown_time", ignore, whyCooldown},
		{"tags", ignore, whyTags},
		{"tag_regex", ignore, whyTags},
		{"max_budget", ignore, whyBudget},
		{"budget_duration", ignore, whyBudget},
		{"default_api_key_tpm_limit", ignore, whyLimits},
		{"default_api_key_rpm_limit", ignore, whyLimits},
		{"region_name", ignore, whyRegion},
		{"max_retries", ignore, whyRetries},
		{"num_retries", ignore, whyRetries},
		// LiteLLM's own behaviour.
		{"drop_params", ignore, whyParams},
		{"additional_drop_params", ignore, whyParams},
		{"allowed_openai_params", ignore, whyParams},
		{"merge_reasoning_content_in_choices", ignore, whyParams},
		{"configurable_clientside_auth_params", ignore, whyClientAuth},
		{"use_in_pass_through", ignore, whyPassThrough},
		{"use_litellm_proxy", ignore, whyProxyRoute},
		{"mock_response", ignore, whyMock},
		{"provider_affinity_header", ignore, whyAffinity},
		{"keepalive_seconds", ignore, whyKeepalive},
		{"allow_client_keepalive_override", ignore, whyKeepalive},
		{"auto_router_config_path", ignore, whyAutoRouter},
		{"auto_router_config", ignore, whyAutoRouter},
		{"auto_router_default_model", ignore, whyAutoRouter},
		{"auto_router_embedding_model", ignore, whyAutoRouter},
		{"vector_store_id", ignore, whyAgents},
		{"model_info", ignore, whyModelInfo},
		// Azure Entra ID sign-in.
		{"tenant_id", ignore, whyEntra},
		{"client_id", ignore, whyEntra},
		{"client_secret", ignore, whyEntra},
		{"azure_username", ignore, whyEntra},
		{"azure_password", ignore, whyEntra},
		{"azure_scope", ignore, whyEntra},
		{"azure_ad_token_provider", ignore, whyEntra},
		// AWS.
		{"aws_access_key_id", ignore, whyAWS},
		{"aws_secret_access_key", ignore, whyAWS},
		{"aws_session_token", ignore, whyAWS},
		{"aws_region_name", ignore, whyAWS},
		{"aws_session_name", ignore, whyAWS},
		{"aws_profile_name", ignore, whyAWS},
		{"aws_role_name", ignore, whyAWS},
		{"aws_web_identity_token", ignore, whyAWS},
		{"aws_sts_endpoint", ignore, whyAWS},
		{"aws_external_id", ignore, whyAWS},
		{"aws_session_tags", ignore, whyAWS},
		{"aws_bedrock_runtime_endpoint", ignore, whyAWS},
		{"aws_bedrock_project_id", ignore, whyAWS},
		{"bedrock_tags", ignore, whyAWS},
		{"aws_batch_role_arn", ignore, whyFiles},
		{"s3_bucket_name", ignore, whyFiles},
		{"s3_region_name", ignore, whyFiles},
		{"s3_endpoint_url", ignore, whyFiles},
		{"s3_access_key_id", ignore, whyFiles},
		{"s3_secret_access_key", ignore, whyFiles},
		{"s3_encryption_key_id", ignore, whyFiles},
		{"s3_bucket_owner", ignore, whyFiles},
		{"s3_output_bucket_name", ignore, whyFiles},
		// Google and IBM.
		{"vertex_project", ignore, whyVertex},
		{"vertex_location", ignore, whyVertex},
		{"vertex_credentials", ignore, whyVertex},
		{"gcs_bucket_name", ignore, whyFiles},
		{"bucket_name", ignore, whyFiles},
		{"watsonx_region_name", ignore, "IBM watsonx settings; this proxy does not exchange IBM IAM tokens"},
		// Pricing.
		{"input_cost_per_token", ignore, whyCost},
		{"output_cost_per_token", ignore, whyCost},
		{"input_cost_per_second", ignore, whyCost},
		{"output_cost_per_second", ignore, whyCost},
		{"output_cost_per_second_480p", ignore, whyCost},
		{"output_cost_per_second_720p", ignore, whyCost},
		{"output_cost_per_second_768p", ignore, whyCost},
		{"output_cost_per_second_1080p", ignore, whyCost},
		{"output_cost_per_second_2k", ignore, whyCost},
		{"output_cost_per_second_4k", ignore, whyCost},
		// Prompt templates of text-completion servers.
		{"initial_prompt_value", ignore, whyTemplate},
		{"roles", ignore, whyTemplate},
		{"final_prompt_value", ignore, whyTemplate},
		{"bos_token", ignore, whyTemplate},
		{"eos_token", ignore, whyTemplate},
		{"hf_model_name", ignore, whyTemplate},
	},
	secLiteLLMSettings: {
		{"callbacks", read, ""},
		{"code_interpreter_interception_params", read, ""}, // ciproxy's own
		{"num_retries", read, ""},
		{"request_timeout", read, ""},
		{"success_callback", ignore, whyLogging},
		{"failure_callback", ignore, whyLogging},
		{"service_callbacks", ignore, whyLogging},
		{"turn_off_message_logging", ignore, whyLogging},
		{"redact_user_api_key_info", ignore, whyLogging},
		{"langfuse_default_tags", ignore, whyLogging},
		{"log_raw_request_response", ignore, whyLogging},
		{"json_logs", ignore, "LiteLLM's JSON log switch; this proxy's format is --log-format (json by default)"},
		{"set_verbose", ignore, whyDebug},
		{"force_ipv4", ignore, "LiteLLM's IPv4-only switch; this proxy dials what the resolver returns"},
		{"ssl_verify", ignore, "LiteLLM's TLS verification switch; this proxy always verifies upstream certificates"},
		{"drop_params", ignore, whyParams},
		{"modify_params", ignore, whyParams},
		{"enable_json_schema_validation", ignore, whyParams},
		{"LITELLM_DISABLE_STOP_SEQUENCE_LIMIT", ignore, whyParams},
		{"fallbacks", ignore, whyFallbacks},
		{"default_fallbacks", ignore, whyFallbacks},
		{"context_window_fallbacks", ignore, whyFallbacks},
		{"content_policy_fallbacks", ignore, whyFallbacks},
		{"allowed_fails", ignore, whyCooldown},
		{"cooldown_time", ignore, whyCooldown},
		{"cache", ignore, whyCache},
		{"cache_params", ignore, whyCache},
		{"enable_preview_features", ignore, "LiteLLM's preview features; not implemented"},
		{"mcp_aliases", ignore, whyMCP},
		{"guardrails", ignore, whyGuardrails},
		{"custom_provider_map", ignore, "LiteLLM's custom Python providers; this proxy calls OpenAI-compatible providers only"},
		{"post_call_rules", ignore, whyGuardrails},
		{"model_group_settings", ignore, whyAlias},
		{"priority_reservation_settings", ignore, whyScheduler},
		{"global_prompt_directory", ignore, whyPrompts},
		{"global_bitbucket_config", ignore, whyPrompts},
		{"global_gitlab_config", ignore, whyPrompts},
		{"responses", ignore, "LiteLLM's Responses API settings (background-mode polling); this proxy passes background requests through"},
		{"default_team_settings", ignore, whyDB},
		{"upperbound_key_generate_params", ignore, whyAuth},
		{"key_generation_settings", ignore, whyAuth},
		{"max_internal_user_budget", ignore, whyBudget},
		{"default_max_internal_user_budget", ignore, whyBudget},
		{"default_internal_user_params", ignore, whyDB},
		{"max_end_user_budget", ignore, whyBudget},
		{"max_budget", ignore, whyBudget},
		{"budget_duration", ignore, whyBudget},
		{"disable_end_user_cost_tracking", ignore, whyCost},
		{"disable_end_user_cost_tracking_prometheus_only", ignore, whyCost},
		{"disable_add_transform_inline_image_block", ignore, whyParams},
		{"use_chat_completions_url_for_anthropic_messages", ignore, "LiteLLM's routing of /v1/messages; this proxy does not serve /v1/messages"},
		{"disable_hf_tokenizer_download", ignore, "LiteLLM's token counting; this proxy counts no tokens"},
		{"enable_key_alias_format_validation", ignore, whyAuth},
		{"disable_copilot_system_to_assistant", ignore, whyParams},
		{"public_model_groups", ignore, whyUI},
		{"public_model_groups_links", ignore, whyUI},
		{"store_audit_logs", ignore, whyDB},
		{"return_response_headers", ignore, "LiteLLM's copy of provider headers; this proxy passes the upstream's headers through"},
		{"telemetry", ignore, "LiteLLM's telemetry; this proxy sends none"},
	},
	secGeneral: {
		{"master_key", read, ""},
		{"container_secret", read, ""},                   // ciproxy's own
		{"max_request_body_size", read, ""},              // ciproxy's own
		{"shutdown_grace", read, ""},                     // ciproxy's own
		{"data_dir", read, ""},                           // ciproxy's own
		{"max_file_upload_size", read, ""},               // ciproxy's own
		{"max_file_storage_per_key", read, ""},           // ciproxy's own
		{"max_concurrent_uploads_per_key", read, ""},     // ciproxy's own
		{"max_upload_bytes_in_flight", read, ""},         // ciproxy's own
		{"upload_timeout", read, ""},                     // ciproxy's own
		{"max_inline_bytes_in_flight", read, ""},         // ciproxy's own
		{"max_inline_bytes_in_flight_per_key", read, ""}, // ciproxy's own
		{"client_keys", read, ""},                        // ciproxy's own: keys besides master_key
		{"max_containers", read, ""},                     // ciproxy's own quotas (quotas.go)
		{"max_containers_per_key", read, ""},             // ciproxy's own
		{"container_creates_per_minute", read, ""},       // ciproxy's own
		{"container_create_burst", read, ""},             // ciproxy's own
		{"max_concurrent_requests", read, ""},            // ciproxy's own
		{"max_concurrent_requests_per_key", read, ""},    // ciproxy's own
		{"advertise_url", read, ""},                      // ciproxy's own: where the other replicas reach this one
		{"max_request_size_mb", read, ""},
		{"completion_model", ignore, whyDefaults},
		{"image_generation_model", ignore, whyDefaults},
		{"embedding_model", ignore, whyDefaults},
		{"moderation_model", ignore, whyDefaults},
		{"database_url", ignore, whyDB},
		{"database_connection_pool_limit", ignore, whyDB},
		{"database_connection_timeout", ignore, whyDB},
		{"allow_requests_on_db_unavailable", ignore, whyDB},
		{"store_model_in_db", ignore, whyDB},
		{"supported_db_objects", ignore, whyDB},
		{"disable_prisma_schema_update", ignore, whyDB},
		{"disable_spend_logs", ignore, whyBudget},
		{"disable_spend_updates", ignore, whyBudget},
		{"store_prompts_in_spend_logs", ignore, whyBudget},
		{"maximum_spend_logs_retention_period", ignore, whyBudget},
		{"maximum_spend_logs_retention_interval", ignore, whyBudget},
		{"proxy_batch_write_at", ignore, whyBudget},
		{"proxy_batch_polling_interval", ignore, whyFiles},
		{"proxy_budget_rescheduler_min_time", ignore, whyBudget},
		{"proxy_budget_rescheduler_max_time", ignore, whyBudget},
		{"disable_reset_budget", ignore, whyBudget},
		{"spend_report_frequency", ignore, whyBudget},
		{"custom_auth", ignore, whyAuth},
		{"custom_key_generate", ignore, whyAuth},
		{"custom_sso", ignore, whyAuth},
		{"custom_ui_sso_sign_in_handler", ignore, whyAuth},
		{"enable_jwt_auth", ignore, whyAuth},
		{"litellm_jwtauth", ignore, whyAuth},
		{"enable_oauth2_auth", ignore, whyAuth},
		{"enable_oauth2_proxy_auth", ignore, whyAuth},
		{"oauth2_config_mappings", ignore, whyAuth},
		{"allow_user_auth", ignore, whyAuth},
		{"allowed_routes", ignore, whyAuth},
		{"public_routes", ignore, whyAuth},
		{"admin_only_routes", ignore, whyAuth},
		{"allowed_ips", ignore, "LiteLLM's client IP allow-list; restrict who reaches this proxy in the network"},
		{"use_x_forwarded_for", ignore, "LiteLLM's client IP from X-Forwarded-For; this proxy does not filter by client IP"},
		{"litellm_key_header_name", ignore, whyAuth},
		{"allow_client_side_credentials", ignore, whyClientAuth},
		{"user_api_key_cache_ttl", ignore, whyAuth},
		{"default_team_disabled", ignore, whyAuth},
		{"ui_access_mode", ignore, whyUI},
		{"service_account_settings", ignore, whyAuth},
		{"role_permissions", ignore, whyAuth},
		{"user_mcp_management_mode", ignore, whyMCP},
		{"disable_master_key_return", ignore, whyUI},
		{"disable_adding_master_key_hash_to_db", ignore, whyDB},
		{"disable_responses_id_security", ignore, whyPlain},
		{"reject_clientside_metadata_tags", ignore, whyBudget},
		{"enforce_user_param", ignore, whyEnterprise},
		{"enforced_params", ignore, whyEnterprise},
		{"key_management_system", ignore, whySecrets},
		{"key_management_settings", ignore, whySecrets},
		{"use_azure_key_vault", ignore, whySecrets},
		{"use_google_kms", ignore, whySecrets},
		{"max_parallel_requests", ignore, whyParallel},
		{"global_max_parallel_requests", ignore, whyParallel},
		{"max_response_size_mb", ignore, "LiteLLM's response size limit; this proxy streams upstream answers through"},
		{"disable_retry_on_max_parallel_request_limit_error", ignore, whyParallel},
		{"background_health_checks", ignore, whyHealth},
		{"health_check_interval", ignore, whyHealth},
		{"health_check_details", ignore, whyHealth},
		{"use_shared_health_check", ignore, whyHealth},
		{"alerting", ignore, whyAlerting},
		{"alerting_threshold", ignore, whyAlerting},
		{"alert_types", ignore, whyAlerting},
		{"alert_to_webhook_url", ignore, whyAlerting},
		{"alerting_args", ignore, whyAlerting},
		{"pass_through_endpoints", ignore, whyPassThrough},
		{"use_client_credentials_pass_through_routes", ignore, whyPassThrough},
		{"forward_openai_org_id", ignore, whyClientAuth},
		{"forward_client_headers_to_llm_api", ignore, "LiteLLM forwards only chosen client headers; this proxy forwards every client header but credentials and hop-by-hop ones"},
		{"infer_model_from_keys", ignore, whyDefaults},
		{"litellm_license", ignore, whyEnterprise},
	},
	secRouter: {
		{"redis_host", read, ""},
		{"redis_port", read, ""},
		{"redis_password", read, ""},
		{"redis_url", read, ""},
		{"redis_db", read, ""},
		{"num_retries", read, ""},
		{"timeout", read, ""},
		{"stream_timeout", read, ""},
		{"stream_idle_timeout", read, ""},
		{"health_check_interval", read, ""}, // refused, as LiteLLM refuses it here
		{"routing_strategy", ignore, whyRouting},
		{"routing_strategy_args", ignore, whyRouting},
		{"routing_groups", ignore, whyRouting},
		{"cache_kwargs", ignore, whyCache},
		{"cache_params", ignore, whyCache},
		{"cache_responses", ignore, whyCache},
		{"caching_groups", ignore, whyCache},
		{"client_ttl", ignore, whyClientTTL},
		{"retry_after", ignore, whyRetryPolicy},
		{"retry_policy", ignore, whyRetryPolicy},
		{"model_group_retry_policy", ignore, whyRetryPolicy},
		{"fallbacks", ignore, whyFallbacks},
		{"context_window_fallbacks", ignore, whyFallbacks},
		{"content_policy_fallbacks", ignore, whyFallbacks},
		{"default_fallbacks", ignore, whyFallbacks},
		{"max_fallbacks", ignore, whyFallbacks},
		{"allowed_fails", ignore, whyCooldown},
		{"allowed_fails_policy", ignore, whyCooldown},
		{"cooldown_time", ignore, whyCooldown},
		{"disable_cooldowns", ignore, whyCooldown},
		{"enable_pre_call_checks", ignore, whyPreCall},
		{"enable_pre_call_check", ignore, whyPreCall},
		{"optional_pre_call_checks", ignore, whyPreCall},
		{"deployment_affinity_ttl_seconds", ignore, whyAffinity},
		{"enable_tag_filtering", ignore, whyTags},
		{"tag_filtering_match_any", ignore, whyTags},
		{"model_group_alias", ignore, whyAlias},
		{"default_litellm_params", ignore, "LiteLLM's params for every request; set them per deployment in litellm_params"},
		{"default_max_parallel_requests", ignore, whyParallel},
		{"default_priority", ignore, whyScheduler},
		{"polling_interval", ignore, whyScheduler},
		{"provider_budget_config", ignore, whyBudget},
		{"alerting_config", ignore, whyAlerting},
		{"router_general_settings", ignore, "LiteLLM's router internals; not applicable"},
		{"assistants_config", ignore, "LiteLLM's Assistants API settings; not implemented"},
		{"debug_level", ignore, whyDebug},
		{"set_verbose", ignore, whyDebug},
		{"ignore_invalid_deployments", ignore, "LiteLLM's switch to skip deployments it cannot set up; this proxy always loads the others, as LiteLLM's proxy does"},
		{"search_tools", ignore, whySearch},
		{"guardrail_list", ignore, whySearch},
	},
	secCredential: {
		{"credential_name", read, ""},
		{"credential_values", read, ""},
		{"credential_info", read, ""}, // open, metadata
	},
}

// sectionKeys returns the keys of section that the proxy reads (params included) and those it
// ignores.
func sectionKeys(section string) (readable, ignored []string) {
	for _, k := range vocabulary[section] {
		if k.kind == ignore {
			ignored = append(ignored, k.key)
		} else {
			readable = append(readable, k.key)
		}
	}
	return readable, ignored
}

// lookupKey returns the vocabulary entry of key in section.
func lookupKey(section, key string) (vocabKey, bool) {
	for _, k := range vocabulary[section] {
		if k.key == key {
			return k, true
		}
	}
	return vocabKey{}, false
}
