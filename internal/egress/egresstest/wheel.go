package egresstest

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Wheel builds a pure-Python wheel of one module, module/__init__.py holding source, as pip
// installs it: the module, its METADATA and WHEEL, and a RECORD with each file's digest.
func Wheel(t testing.TB, module, version, source string) []byte {
	t.Helper()
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	dist := fmt.Sprintf("%s-%s.dist-info", module, version)
	files := [][2]string{
		{module + "/__init__.py", source},
		{dist + "/METADATA", fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n", strings.ReplaceAll(module, "_", "-"), version)},
		{dist + "/WHEEL", "Wheel-Version: 1.0\nGenerator: ciproxy-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	for _, f := range files {
		w, err := z.Create(f[0])
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, f[1])
		sum := sha256.Sum256([]byte(f[1]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f[0], base64.RawURLEncoding.EncodeToString(sum[:]), len(f[1]))
	}
	fmt.Fprintf(&record, "%s/RECORD,,\n", dist)
	w, err := z.Create(dist + "/RECORD")
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(w, record.String())
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Index serves one project as PyPI's simple API (PEP 503) does: /simple/<project>/ links the
// wheel of a module named as the project (hyphens as underscores), with its digest.
func Index(t testing.TB, project, version, source string) http.Handler {
	module := strings.ReplaceAll(project, "-", "_")
	whl := Wheel(t, module, version, source)
	file := fmt.Sprintf("%s-%s-py3-none-any.whl", module, version)
	sum := sha256.Sum256(whl)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/simple/" + project + "/":
			fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="/files/%s#sha256=%s">%s</a></body></html>`, file, hex.EncodeToString(sum[:]), file)
		case "/files/" + file:
			w.Write(whl)
		default:
			http.NotFound(w, r)
		}
	})
}
