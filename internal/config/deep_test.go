package config

import (
	"strings"
	"testing"
)

// TestParseDeeplyNested: a config nested ten million levels deep (flow or block style) is an
// error, not a stack overflow. yaml.v3 stops at 10,000 levels on its own; this pins that down,
// since a crash here would take the proxy down on a hot reload.
func TestParseDeeplyNested(t *testing.T) {
	for name, doc := range map[string]string{
		"flow sequences": "model_list: " + strings.Repeat("[", 10_000_000),
		"flow mappings":  "model_list: " + strings.Repeat("{a: ", 1_000_000),
		"block mappings": "model_list:\n" + deepBlock(10_200),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse([]byte(doc), "deep.yaml"); err == nil {
				t.Fatal("Parse(a deeply nested document) = nil error; want one")
			}
		})
	}
}

func deepBlock(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(strings.Repeat(" ", i+1))
		b.WriteString("a:\n")
	}
	return b.String()
}
