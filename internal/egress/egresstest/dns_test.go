package egresstest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/dns/dnsmessage"
)

// TestMain fails the package if a server's goroutines outlive their test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// lookup is one d.Resolver().LookupNetIP and what it should give: the addresses in any order, or,
// with notFound, a *net.DNSError that IsNotFound.
type lookup struct {
	network, name string
	want          []string
	notFound      bool
}

func TestDNSResolver(t *testing.T) {
	addr := netip.MustParseAddr
	tests := []struct {
		name    string
		setup   func(d *DNS)
		lookups []lookup
		// queries is what Queries says of counted after the lookups. Go's resolver sends an A and
		// an AAAA query for "ip", one query for "ip4" or "ip6".
		counted string
		queries int
	}{
		{
			name:  "A only",
			setup: func(d *DNS) { d.Set("v4.test", addr("192.0.2.1")) },
			lookups: []lookup{
				{"ip", "v4.test", []string{"192.0.2.1"}, false},
				{"ip4", "v4.test", []string{"192.0.2.1"}, false},
				// The name exists but has no AAAA: an empty answer, which the resolver reports
				// as not found for that family.
				{"ip6", "v4.test", nil, true},
			},
			counted: "v4.test", queries: 4,
		},
		{
			name:  "AAAA only",
			setup: func(d *DNS) { d.Set("v6.test", addr("2001:db8::1")) },
			lookups: []lookup{
				{"ip", "v6.test", []string{"2001:db8::1"}, false},
				{"ip6", "v6.test", []string{"2001:db8::1"}, false},
				{"ip4", "v6.test", nil, true},
			},
			counted: "v6.test", queries: 4,
		},
		{
			name: "both",
			setup: func(d *DNS) {
				d.Set("both.test", addr("192.0.2.1"), addr("2001:db8::1"), addr("192.0.2.2"))
			},
			lookups: []lookup{
				{"ip", "both.test", []string{"192.0.2.1", "192.0.2.2", "2001:db8::1"}, false},
				{"ip4", "both.test", []string{"192.0.2.1", "192.0.2.2"}, false},
				{"ip6", "both.test", []string{"2001:db8::1"}, false},
			},
			counted: "both.test", queries: 4,
		},
		{
			name:  "IPv4-mapped IPv6 is AAAA",
			setup: func(d *DNS) { d.Set("mapped.test", addr("::ffff:127.0.0.1")) },
			lookups: []lookup{
				// Looked up as "ip": for "ip6", Go's resolver drops IPv4-mapped addresses itself.
				{"ip", "mapped.test", []string{"::ffff:127.0.0.1"}, false},
				// Not an A record.
				{"ip4", "mapped.test", nil, true},
			},
			counted: "mapped.test", queries: 3,
		},
		{
			name:  "NXDOMAIN",
			setup: func(d *DNS) { d.Set("other.test", addr("192.0.2.1")) },
			lookups: []lookup{
				{"ip", "missing.test", nil, true},
				{"ip4", "missing.test.", nil, true},
			},
			// A name not in the table is still counted.
			counted: "missing.test", queries: 3,
		},
		{
			name:  "case-insensitive",
			setup: func(d *DNS) { d.Set("MiXed.Example.TEST.", addr("192.0.2.7")) },
			lookups: []lookup{
				{"ip4", "mixed.example.test", []string{"192.0.2.7"}, false},
				{"ip4", "MIXED.EXAMPLE.TEST.", []string{"192.0.2.7"}, false},
			},
			counted: "mIxEd.example.test", queries: 2,
		},
		{
			name:  "later Set replaces",
			setup: func(d *DNS) { d.Set("moved.test", addr("192.0.2.1")); d.Set("moved.test", addr("192.0.2.2")) },
			lookups: []lookup{
				{"ip4", "moved.test", []string{"192.0.2.2"}, false},
			},
			counted: "moved.test", queries: 1,
		},
		{
			name: "Sequence advances, then stays on the last",
			setup: func(d *DNS) {
				d.Sequence("rebind.test",
					[]netip.Addr{addr("198.51.100.1"), addr("2001:db8::1")},
					[]netip.Addr{addr("127.0.0.1"), addr("::1")})
			},
			lookups: []lookup{
				// One "ip" lookup is an A and an AAAA query: each is its type's first.
				{"ip", "rebind.test", []string{"198.51.100.1", "2001:db8::1"}, false},
				{"ip", "rebind.test", []string{"127.0.0.1", "::1"}, false},
				{"ip4", "rebind.test", []string{"127.0.0.1"}, false},
			},
			counted: "rebind.test", queries: 5,
		},
		{
			name: "Sequence counts each type apart",
			setup: func(d *DNS) {
				d.Sequence("split.test",
					[]netip.Addr{addr("198.51.100.1"), addr("2001:db8::1")},
					[]netip.Addr{addr("127.0.0.1"), addr("::1")})
			},
			lookups: []lookup{
				// The A query moves A on; AAAA is still at its first answer.
				{"ip4", "split.test", []string{"198.51.100.1"}, false},
				{"ip6", "split.test", []string{"2001:db8::1"}, false},
				{"ip4", "split.test", []string{"127.0.0.1"}, false},
				{"ip6", "split.test", []string{"::1"}, false},
			},
			counted: "split.test", queries: 4,
		},
		{
			name: "Set after Sequence starts again",
			setup: func(d *DNS) {
				d.Sequence("reset.test", []netip.Addr{addr("198.51.100.1")}, []netip.Addr{addr("127.0.0.1")})
				d.Set("reset.test", addr("192.0.2.9"))
			},
			lookups: []lookup{
				{"ip4", "reset.test", []string{"192.0.2.9"}, false},
				{"ip4", "reset.test", []string{"192.0.2.9"}, false},
			},
			counted: "reset.test", queries: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDNS(t)
			tt.setup(d)
			r := d.Resolver()
			for i, l := range tt.lookups {
				got, err := lookupNetIP(t, r, l.network, l.name)
				if l.notFound {
					var dnsErr *net.DNSError
					if !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
						t.Fatalf("lookup %d LookupNetIP(%q, %q) = %v, %v; want a not-found *net.DNSError", i, l.network, l.name, got, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("lookup %d LookupNetIP(%q, %q): %v", i, l.network, l.name, err)
				}
				if want := sortedAddrs(l.want); !slices.Equal(got, want) {
					t.Fatalf("lookup %d LookupNetIP(%q, %q) = %v; want %v", i, l.network, l.name, got, want)
				}
			}
			if got := d.Queries(tt.counted); got != tt.queries {
				t.Errorf("Queries(%q) = %d; want %d", tt.counted, got, tt.queries)
			}
		})
	}
}

// lookupNetIP looks name up with a deadline, so that a server that fails to answer fails the test
// instead of hanging it, and gives the addresses sorted, since the resolver orders them by its own
// preference.
func lookupNetIP(t *testing.T, r *net.Resolver, network, name string) ([]netip.Addr, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got, err := r.LookupNetIP(ctx, network, name)
	slices.SortFunc(got, netip.Addr.Compare)
	return got, err
}

func sortedAddrs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// A reply too big for UDP comes truncated, and the resolver asks again over TCP: this is the TCP
// side at work, and the truncated reply must not use up a step of a sequence.
func TestDNSTruncatedFallsBackToTCP(t *testing.T) {
	d := NewDNS(t)
	var many []netip.Addr
	for i := range 200 {
		many = append(many, netip.AddrFrom4([4]byte{10, 0, byte(i / 256), byte(i % 256)}))
	}
	d.Sequence("big.test", many, []netip.Addr{netip.MustParseAddr("192.0.2.1")})

	got, err := lookupNetIP(t, d.Resolver(), "ip4", "big.test")
	if err != nil {
		t.Fatal(err)
	}
	if want := slices.Clone(many); !slices.Equal(got, want) {
		t.Fatalf("got %d addresses; want the %d of the first step", len(got), len(want))
	}
	// The UDP query that came back truncated, then the TCP one.
	if n := d.Queries("big.test"); n != 2 {
		t.Errorf("Queries = %d; want 2", n)
	}
	got, err = lookupNetIP(t, d.Resolver(), "ip4", "big.test")
	if err != nil {
		t.Fatal(err)
	}
	if want := sortedAddrs([]string{"192.0.2.1"}); !slices.Equal(got, want) {
		t.Errorf("second lookup = %v; want %v", got, want)
	}
}

// Other query types: an empty answer for a name in the table, NXDOMAIN for one not in it. And the
// answers carry TTL 0 and the question as asked.
func TestDNSRawAnswers(t *testing.T) {
	d := NewDNS(t)
	d.Set("known.test", netip.MustParseAddr("192.0.2.1"))
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			tests := []struct {
				name      string
				qtype     dnsmessage.Type
				rcode     dnsmessage.RCode
				answers   int
				wantAddrA [4]byte
			}{
				{"Known.Test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, 1, [4]byte{192, 0, 2, 1}},
				{"known.test.", dnsmessage.TypeMX, dnsmessage.RCodeSuccess, 0, [4]byte{}},
				{"known.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, 0, [4]byte{}},
				{"unknown.test.", dnsmessage.TypeTXT, dnsmessage.RCodeNameError, 0, [4]byte{}},
			}
			for i, tt := range tests {
				id := uint16(100 + i)
				resp := exchange(t, network, d.Addr(), query(t, id, tt.name, tt.qtype))
				var m dnsmessage.Message
				if err := m.Unpack(resp); err != nil {
					t.Fatalf("%s %v: unpacking the reply: %v", tt.name, tt.qtype, err)
				}
				if m.ID != id || !m.Response || m.RCode != tt.rcode || len(m.Answers) != tt.answers {
					t.Fatalf("%s %v: reply id %d response %v rcode %v with %d answers; want id %d, a response, %v, %d answers",
						tt.name, tt.qtype, m.ID, m.Response, m.RCode, len(m.Answers), id, tt.rcode, tt.answers)
				}
				if len(m.Questions) != 1 || m.Questions[0].Name.String() != tt.name || m.Questions[0].Type != tt.qtype {
					t.Errorf("%s %v: question in reply = %v; want it as asked", tt.name, tt.qtype, m.Questions)
				}
				for _, a := range m.Answers {
					if a.Header.TTL != 0 {
						t.Errorf("%s %v: TTL %d; want 0", tt.name, tt.qtype, a.Header.TTL)
					}
					if r, ok := a.Body.(*dnsmessage.AResource); !ok || r.A != tt.wantAddrA {
						t.Errorf("%s %v: answer %v; want A %v", tt.name, tt.qtype, a.Body, tt.wantAddrA)
					}
				}
			}
		})
	}
}

// Garbage, a reply sent to the server and a message with no question get no answer, and the
// server still answers the query that follows, on the same socket or connection.
func TestDNSIgnoresMalformed(t *testing.T) {
	d := NewDNS(t)
	d.Set("ok.test", netip.MustParseAddr("192.0.2.1"))

	reply := query(t, 1, "ok.test.", dnsmessage.TypeA)
	reply[2] |= 0x80 // the QR bit: this is a response, not a query
	noQuestion, err := (&dnsmessage.Message{Header: dnsmessage.Header{ID: 2}}).Pack()
	if err != nil {
		t.Fatal(err)
	}
	bad := [][]byte{
		{},
		{0x12},
		[]byte("not a dns message at all"),
		query(t, 3, "ok.test.", dnsmessage.TypeA)[:15], // cut inside the question
		reply,
		noQuestion,
	}
	good := query(t, 42, "ok.test.", dnsmessage.TypeA)

	t.Run("udp", func(t *testing.T) {
		c, err := net.Dial("udp", d.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, b := range bad {
			if _, err := c.Write(b); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.Write(good); err != nil {
			t.Fatal(err)
		}
		// The first datagram back must be the reply to the good query: none came for the bad ones.
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if id := binary.BigEndian.Uint16(buf[:n]); id != 42 {
			t.Fatalf("first reply has id %d; want 42, the good query's", id)
		}
	})
	t.Run("tcp", func(t *testing.T) {
		c, err := net.Dial("tcp", d.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, b := range append(bad, good) {
			if _, err := c.Write(frame(b)); err != nil {
				t.Fatal(err)
			}
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := readFrame(c)
		if err != nil {
			t.Fatal(err)
		}
		if id := binary.BigEndian.Uint16(resp); id != 42 {
			t.Fatalf("first reply has id %d; want 42, the good query's", id)
		}
	})
	// Only the two good queries reached the point of being counted.
	if n := d.Queries("ok.test"); n != 2 {
		t.Errorf("Queries = %d; want 2", n)
	}
}

// Lookups and changes from many goroutines at once, for the race detector; each lookup must see one
// of the answers that name has had.
func TestDNSConcurrent(t *testing.T) {
	d := NewDNS(t)
	a1, a2 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	d.Set("busy.test", a1)
	r := d.Resolver()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := range 20 {
		wg.Go(func() {
			for j := range 5 {
				if i%4 == 0 {
					d.Set("busy.test", []netip.Addr{a1, a2}[j%2])
					d.Queries("busy.test")
					continue
				}
				got, err := r.LookupNetIP(t.Context(), "ip4", "busy.test")
				if err != nil {
					errs <- err
					return
				}
				if len(got) != 1 || (got[0] != a1 && got[0] != a2) {
					errs <- fmt.Errorf("got %v", got)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// query packs a standard query for name, with an EDNS(0) record as Go's resolver sends.
func query(t *testing.T, id uint16, name string, qtype dnsmessage.Type) []byte {
	t.Helper()
	var opt dnsmessage.ResourceHeader
	if err := opt.SetEDNS0(1232, dnsmessage.RCodeSuccess, false); err != nil {
		t.Fatal(err)
	}
	m := dnsmessage.Message{
		Header: dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{
			Name: dnsmessage.MustNewName(name), Type: qtype, Class: dnsmessage.ClassINET,
		}},
		Additionals: []dnsmessage.Resource{{Header: opt, Body: &dnsmessage.OPTResource{}}},
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// exchange sends msg to addr over network ("udp" or "tcp") and returns the reply.
func exchange(t *testing.T, network, addr string, msg []byte) []byte {
	t.Helper()
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if network == "tcp" {
		if _, err := c.Write(frame(msg)); err != nil {
			t.Fatal(err)
		}
		resp, err := readFrame(c)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// frame puts the two-byte length in front of msg, as DNS over TCP does.
func frame(msg []byte) []byte {
	return append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...)
}

func readFrame(r io.Reader) ([]byte, error) {
	var size [2]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, binary.BigEndian.Uint16(size[:]))
	_, err := io.ReadFull(r, msg)
	return msg, err
}
