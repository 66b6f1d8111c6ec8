package config_test

import (
	"testing"

	. "github.com/ciproxy/ciproxy/internal/config"
)

// TestForModel: Interception.ForModel replaces Tools only when the model's entry lists tools.
func TestForModel(t *testing.T) {
	global := Interception{Tools: []string{"code_interpreter"}, FunctionName: "py"}
	for _, tc := range []struct {
		model []string
		want  map[string]bool
	}{
		{nil, map[string]bool{"code_interpreter": true, "shell": false}},
		{[]string{}, map[string]bool{"code_interpreter": false, "shell": false}},
		{[]string{"shell"}, map[string]bool{"code_interpreter": false, "shell": true}},
	} {
		got := global.ForModel(tc.model)
		for tool, want := range tc.want {
			if got.Intercepts(tool) != want {
				t.Errorf("ForModel(%q).Intercepts(%s) = %v; want %v", tc.model, tool, !want, want)
			}
		}
		if got.FunctionName != "py" {
			t.Errorf("ForModel(%q) lost the other settings: %+v", tc.model, got)
		}
	}
}
