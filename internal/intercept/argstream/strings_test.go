package argstream

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestStrings: whatever the chunking, the pieces of each element concatenate to the value
// json.Unmarshal gives it, each element ends exactly once, and in order.
func TestStrings(t *testing.T) {
	for _, tc := range []struct {
		name, args string
		want       []string // nil: the array is not streamed
	}{
		{"one", `{"commands":["ls -la"]}`, []string{"ls -la"}},
		{"several, with escapes", `{"commands":["echo \"hi\" > a.txt","printf 'x\\n\u00e9\ud83d\ude00'", ""], "timeout_ms":null}`,
			[]string{`echo "hi" > a.txt`, "printf 'x\\n\u00e9\U0001F600'", ""}},
		{"after other fields", `{"timeout_ms": 5000, "x": {"commands": ["no"]}, "commands" : [ "a" , "b" ] }`, []string{"a", "b"}},
		{"empty", `{"commands":[]}`, []string{}},
		{"utf-8", `{"commands":["echo héllo wörld 😀"]}`, []string{"echo héllo wörld 😀"}},
		{"not an array", `{"commands":"ls"}`, nil},
		{"a number first", `{"commands":[1,"ls"]}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			for round := range 50 {
				d := NewStrings("commands")
				var got []string
				var done []int
				rest := tc.args
				for rest != "" {
					n := 1 + r.IntN(len(rest))
					if round == 0 {
						n = 1 // byte by byte
					}
					for _, p := range d.Pieces(rest[:n]) {
						for len(got) <= p.Elem {
							got = append(got, "")
						}
						if p.Elem != len(got)-1 || slices.Contains(done, p.Elem) {
							t.Fatalf("piece %+v out of order (elements %q, done %v)", p, got, done)
						}
						got[p.Elem] += p.Text
						if p.Done {
							done = append(done, p.Elem)
						}
					}
					rest = rest[n:]
				}
				if tc.want == nil {
					if len(got) > 0 && len(done) == len(got) && d.Complete() {
						t.Fatalf("streamed %q; want nothing complete", got)
					}
					continue
				}
				var m struct{ Commands []string }
				if err := json.Unmarshal([]byte(tc.args), &m); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, m.Commands) && !(len(got) == 0 && len(m.Commands) == 0) {
					t.Fatalf("streamed %q; json.Unmarshal gives %q", got, m.Commands)
				}
				if len(done) != len(got) || !d.Complete() || d.Err() != nil {
					t.Fatalf("done %v of %d elements, complete %v, err %v", done, len(got), d.Complete(), d.Err())
				}
			}
		})
	}
}

// FuzzStrings: for any input and chunking, the pieces never panic, come in order, and for input
// that json.Unmarshal reads as an object with a "commands" array of strings, equal its elements.
func FuzzStrings(f *testing.F) {
	f.Add(`{"commands":["ls","echo \"a\""]}`, []byte{1, 2, 3})
	f.Add(`{"x":[{"commands":1}],"commands":["\ud83d\ude00\u00e9\n",""],"timeout_ms":null}`, []byte{0, 5, 7, 1, 1, 1})
	f.Add(`{"commands":[1,"a"]}`, []byte{})
	f.Fuzz(func(t *testing.T, args string, cuts []byte) {
		d := NewStrings("commands")
		var got []string
		rest := args
		feed := func(c string) {
			for _, p := range d.Pieces(c) {
				if p.Elem > len(got) {
					t.Fatalf("piece for element %d after %d elements", p.Elem, len(got))
				}
				if p.Elem == len(got) {
					got = append(got, "")
				}
				got[p.Elem] += p.Text
			}
		}
		for _, c := range cuts {
			if rest == "" {
				break
			}
			n := min(int(c%16), len(rest))
			feed(rest[:n])
			rest = rest[n:]
		}
		feed(rest)
		var m map[string]json.RawMessage
		if json.Unmarshal([]byte(args), &m) != nil || d.Duplicate() {
			return
		}
		var cmds []string
		if json.Unmarshal(m["commands"], &cmds) != nil || m["commands"] == nil {
			return
		}
		if !slices.Equal(got, cmds) && !(len(got) == 0 && len(cmds) == 0) {
			t.Fatalf("streamed %q; json.Unmarshal gives %q", got, cmds)
		}
	})
}
