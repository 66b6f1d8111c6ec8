package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox/backends"
)

// FuzzParse feeds arbitrary bytes to the loader, with every sandbox backend decoding its tools: it
// must never panic, and it must either return a config or an *Errors with at least one problem.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.yaml")
	litellm, _ := filepath.Glob("testdata/litellm/*.yaml")
	files = append(files, litellm...)
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		input, _, _ := strings.Cut(string(raw), goldenSep)
		f.Add([]byte(input))
	}
	if raw, err := os.ReadFile("../../config.example.yaml"); err == nil {
		f.Add(raw)
	}
	lookup := func(name string) (string, bool) {
		if name == "SET" {
			return "value", true
		}
		return "", false
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseWith(data, "fuzz.yaml", backends.ParseOptions(lookup))
		if err == nil {
			if c == nil {
				t.Fatal("ParseWith returned neither a config nor an error")
			}
			return
		}
		var errs *Errors
		if !errors.As(err, &errs) {
			t.Fatalf("ParseWith error %T (%v), want *Errors", err, err)
		}
		if len(errs.Problems) == 0 {
			t.Fatal("ParseWith returned an *Errors with no problem")
		}
	})
}
