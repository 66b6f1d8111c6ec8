package egresstest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// NPMRegistry serves one package as the npm registry does: its packument at /<name> (the
// versions, each with its tarball's URL and digests) and the tarball (package/package.json and
// package/index.js holding source). base is the registry's URL as the client reaches it.
func NPMRegistry(t testing.TB, base, name, version, source string) http.Handler {
	t.Helper()
	tgz := npmTarball(t, name, version, source)
	file := fmt.Sprintf("/%s/-/%s-%s.tgz", name, name, version)
	sha := sha1.Sum(tgz)
	integrity := sha512.Sum512(tgz)
	doc, err := json.Marshal(map[string]any{
		"name":      name,
		"dist-tags": map[string]string{"latest": version},
		"versions": map[string]any{version: map[string]any{
			"name": name, "version": version, "main": "index.js",
			"dist": map[string]string{"tarball": base + file, "shasum": hex.EncodeToString(sha[:]),
				"integrity": "sha512-" + base64.StdEncoding.EncodeToString(integrity[:])},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/" + name:
			w.Header().Set("Content-Type", "application/json")
			w.Write(doc)
		case file:
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write(tgz)
		default:
			http.NotFound(w, r)
		}
	})
}

func npmTarball(t testing.TB, name, version, source string) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	manifest := fmt.Sprintf(`{"name": %q, "version": %q, "main": "index.js"}`, name, version)
	for _, f := range [][2]string{{"package/package.json", manifest}, {"package/index.js", source}} {
		if err := tw.WriteHeader(&tar.Header{Name: f[0], Mode: 0o644, Size: int64(len(f[1])), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(f[1]))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
