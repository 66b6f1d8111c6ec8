package settings

import (
	"fmt"
	"sort"
	"strings"
)

// Problem is one thing wrong with a configuration file.
type Problem struct {
	// Line is the 1-based line in the file; 0 when the problem has no single place.
	Line int
	// Msg names the key and what is wrong, never the value of a secret.
	Msg string
}

// Errors is every problem found in one configuration file.
type Errors struct {
	// Path is the file the problems are in.
	Path     string
	Problems []Problem
}

// Error prints one problem per line as "path:LINE: message".
func (e *Errors) Error() string {
	path := e.Path
	if path == "" {
		path = "config"
	}
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		if p.Line > 0 {
			fmt.Fprintf(&b, "%s:%d: %s", path, p.Line, p.Msg)
		} else {
			fmt.Fprintf(&b, "%s: %s", path, p.Msg)
		}
	}
	return b.String()
}

// Err returns the problems found so far as an *Errors in line order (problems on the same line keep
// the order they were found in), or nil when there are none.
func (d *Decoder) Err(path string) error {
	if len(d.problems) == 0 {
		return nil
	}
	ps := append([]Problem(nil), d.problems...)
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].Line < ps[j].Line })
	return &Errors{Path: path, Problems: ps}
}
