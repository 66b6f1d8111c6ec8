package settings

import (
	"fmt"
	"testing"

	"gopkg.in/yaml.v3"
)

func node(t *testing.T, src string) *yaml.Node {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Content[0]
}

func TestMapReportsKeysWithLines(t *testing.T) {
	d := NewDecoder(func(string) (string, bool) { return "", false })
	m := d.Map(node(t, "a: 1\nb: x\nb: y\nzz: 2\nrpm: 5\n"), "p", "p (label)", []string{"a", "b"}, []string{"rpm"})
	if got := m.Int("a", 0, 0); got != 1 {
		t.Errorf("Int(a) = %d; want 1", got)
	}
	if v := m.String("b"); v.S != "x" || m.ValueLine("b") != 2 || m.KeyLine("b") != 2 {
		t.Errorf("String(b) = %+v at line %d; want the first b, line 2", v, m.ValueLine("b"))
	}
	err := d.Err("c.yaml")
	want := "c.yaml:3: p: duplicate key \"b\"\nc.yaml:4: p: unknown key \"zz\""
	if err == nil || err.Error() != want {
		t.Errorf("Err() = %v; want\n%s", err, want)
	}
}

func TestMapWarnsOncePerKey(t *testing.T) {
	d := NewDecoder(func(string) (string, bool) { return "", false })
	m := d.Map(node(t, "key: os.environ/UNSET\n"), "p", "entry", []string{"key"}, nil)
	for range 3 {
		if v := m.String("key"); v.Present || v.Env != "UNSET" {
			t.Fatalf("String(key) = %+v; want absent, from UNSET", v)
		}
	}
	m.Bool("key", false)
	want := []string{"entry: key refers to UNSET, which is not set"}
	if got := d.Warnings(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Warnings() = %q; want %q", got, want)
	}
	if err := d.Err(""); err != nil {
		t.Errorf("Err() = %v; want none", err)
	}
}

func TestMapValues(t *testing.T) {
	src := "size: 2g\nbad_size: lots\nzero: 0\ndur: 90\nflag: maybe\nlist: [a, os.environ/SET]\nurl: http://user:pw@host/x/\n"
	d := NewDecoder(func(n string) (string, bool) { return "v-" + n, n == "SET" })
	m := d.Map(node(t, src), "p", "p", []string{"size", "bad_size", "zero", "dur", "flag", "list", "url", "absent"}, nil)
	if n, text := m.Size("size", 1); n != 2<<30 || text != "2g" {
		t.Errorf("Size(size) = %d, %q; want 2g", n, text)
	}
	if n, text := m.Size("absent", 1<<30); n != 1<<30 || text != "1g" {
		t.Errorf("Size(absent) = %d, %q; want the default, written 1g", n, text)
	}
	if n, _ := m.Size("bad_size", 7); n != 7 {
		t.Errorf("Size(bad_size) = %d; want the default 7", n)
	}
	if n, _ := m.Size("zero", 7); n != 7 {
		t.Errorf("Size(zero) = %d; want the default 7", n)
	}
	if got := m.Duration("dur", 0, false); got.Seconds() != 90 {
		t.Errorf("Duration(dur) = %v; want 90s", got)
	}
	if got := m.Bool("flag", true); !got {
		t.Errorf("Bool(flag) = false; want the default true")
	}
	if got, ok := m.StringList("list"); !ok || fmt.Sprint(got) != "[a v-SET]" {
		t.Errorf("StringList(list) = %q, %v; want [a v-SET]", got, ok)
	}
	if got := m.BaseURL(m.String("url"), m.ValueLine("url"), m.Key("url")); got != "http://user:pw@host/x" {
		t.Errorf("BaseURL(url) = %q; want it without the trailing slash", got)
	}
	want := `c.yaml:2: p.bad_size: "lots" is not a size (write e.g. "512m", "1g" or a number of bytes)` + "\n" +
		`c.yaml:3: p.zero: must be more than 0` + "\n" +
		`c.yaml:5: p.flag: "maybe" is not true or false`
	if err := d.Err("c.yaml"); err == nil || err.Error() != want {
		t.Errorf("Err() = %v; want\n%s", err, want)
	}
}

func TestBaseURLRedactsCredentials(t *testing.T) {
	d := NewDecoder(nil)
	m := d.Map(node(t, "url: ftp://user:secret@host/\n"), "p", "p", []string{"url"}, nil)
	if got := m.BaseURL(m.String("url"), 1, "p.url"); got != "" {
		t.Errorf("BaseURL(ftp) = %q; want none", got)
	}
	want := `p.url: "ftp://REDACTED@host/" is not an absolute http(s) URL`
	if err := d.Err(""); err == nil || err.Error() != "config:1: "+want {
		t.Errorf("Err() = %v; want %q", err, want)
	}
}

func TestMapListsIgnoredKeysAndSuggests(t *testing.T) {
	d := NewDecoder(func(string) (string, bool) { return "", false })
	m := d.Map(node(t, "api_base: x\nrpm: 5\napi_bsae: y\ntpm: 1\n"), "p", "p", []string{"api_base"}, []string{"rpm", "tpm"})
	if got, want := fmt.Sprint(m.IgnoredKeys()), "[{rpm 2} {tpm 4}]"; got != want {
		t.Errorf("IgnoredKeys() = %s; want %s", got, want)
	}
	if got := m.Keys(); fmt.Sprint(got) != "[api_base]" {
		t.Errorf("Keys() = %q; want only the readable key", got)
	}
	want := `c.yaml:3: p: unknown key "api_bsae" (did you mean "api_base"?)`
	if err := d.Err("c.yaml"); err == nil || err.Error() != want {
		t.Errorf("Err() = %v; want %s", err, want)
	}
}

func TestOpenMapTakesAnyKeyButDuplicates(t *testing.T) {
	d := NewDecoder(func(string) (string, bool) { return "", false })
	m := d.OpenMap(node(t, "b: 1\na: 2\nb: 3\n"), "p", "p")
	if got := m.Keys(); fmt.Sprint(got) != "[b a]" {
		t.Errorf("Keys() = %q; want [b a] in file order", got)
	}
	if err := d.Err("c.yaml"); err == nil || err.Error() != `c.yaml:3: p: duplicate key "b"` {
		t.Errorf("Err() = %v; want the duplicate only", err)
	}
}

func TestOverlayComesBeforeTheEnvironment(t *testing.T) {
	d := NewDecoder(func(n string) (string, bool) { return "env-" + n, true })
	d.Overlay(map[string]string{"A": "overlay"})
	m := d.Map(node(t, "x: os.environ/A\ny: os.environ/B\n"), "p", "p", []string{"x", "y"}, nil)
	if x, y := m.String("x"), m.String("y"); x.S != "overlay" || y.S != "env-B" {
		t.Errorf("x = %+v, y = %+v; want the overlay for A and the environment for B", x, y)
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"api_bse", "api_base", 1}, {"temprature", "temperature", 1}, {"rmp", "rpm", 2}, {"abc", "", 3}} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d; want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
