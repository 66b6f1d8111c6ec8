package intercept

import "github.com/tidwall/gjson"

// usage is token usage summed over the loop's upstream calls.
type usage struct {
	seen bool
	sum  usageJSON
}

// usageJSON is the Response's usage object. cache_write_tokens is shown only when an upstream
// reported it (newer servers do).
type usageJSON struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens     int64  `json:"cached_tokens"`
		CacheWriteTokens *int64 `json:"cache_write_tokens,omitempty"`
	} `json:"input_tokens_details"`
	OutputTokens        int64 `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int64 `json:"total_tokens"`
}

// add sums one upstream Response's usage.
func (u *usage) add(r gjson.Result) {
	if !r.IsObject() {
		return
	}
	u.seen = true
	s := &u.sum
	s.InputTokens += r.Get("input_tokens").Int()
	s.InputTokensDetails.CachedTokens += r.Get("input_tokens_details.cached_tokens").Int()
	if cw := r.Get("input_tokens_details.cache_write_tokens"); cw.Exists() {
		if s.InputTokensDetails.CacheWriteTokens == nil {
			s.InputTokensDetails.CacheWriteTokens = new(int64)
		}
		*s.InputTokensDetails.CacheWriteTokens += cw.Int()
	}
	s.OutputTokens += r.Get("output_tokens").Int()
	s.OutputTokensDetails.ReasoningTokens += r.Get("output_tokens_details.reasoning_tokens").Int()
	if tt := r.Get("total_tokens"); tt.Exists() {
		s.TotalTokens += tt.Int()
	} else {
		s.TotalTokens += r.Get("input_tokens").Int() + r.Get("output_tokens").Int()
	}
}

func (u *usage) json() []byte { return marshal(u.sum) }
