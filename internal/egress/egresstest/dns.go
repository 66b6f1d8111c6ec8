// Package egresstest holds helpers for testing code that reaches the network through names: a DNS
// server whose answers a test sets, so that a test can point a name at a loopback address, make a
// name not exist, or change a name's answer between two lookups (DNS rebinding).
package egresstest

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// DNS is a DNS server for tests: it answers A and AAAA queries from its table and NXDOMAIN otherwise.
//
// A name in the table answers every query type without error; a type it has no addresses for
// (an MX query, or AAAA for a name with only IPv4 addresses) gets an empty answer, as a real
// server would, so that a lookup of both families still succeeds. A name not in the table is
// NXDOMAIN whatever the type. Answers have TTL 0 so nothing between the test and the server should
// keep them.
//
// It is safe for concurrent use.
type DNS struct {
	addr string
	udp  net.PacketConn
	tcp  net.Listener
	wg   sync.WaitGroup // the serving goroutines, waited for at cleanup

	mu      sync.Mutex
	names   map[string]*entry // by canonical name (see canonical)
	queries map[string]int    // by canonical name, kept when Set or Sequence replaces an entry
	conns   map[net.Conn]struct{}
	closed  bool
}

// entry is the answers of one name.
type entry struct {
	answers [][]netip.Addr          // answer i is for the i-th query of a type; the last one after that
	seen    map[dnsmessage.Type]int // queries so far, per type, to pick the answer
}

// NewDNS starts a server on 127.0.0.1 (UDP and TCP on the same port) and closes it at t.Cleanup.
func NewDNS(t testing.TB) *DNS {
	t.Helper()
	udp, tcp, err := listen()
	if err != nil {
		t.Fatalf("egresstest: DNS server: %v", err)
	}
	d := &DNS{
		addr:    udp.LocalAddr().String(),
		udp:     udp,
		tcp:     tcp,
		names:   make(map[string]*entry),
		queries: make(map[string]int),
		conns:   make(map[net.Conn]struct{}),
	}
	d.wg.Add(2)
	go d.serveUDP()
	go d.serveTCP()
	t.Cleanup(d.close)
	return d
}

// listen opens UDP on a free loopback port, then TCP on the same one. The kernel picks the UDP
// port without knowing whether its TCP twin is free, so another process may hold it: try again
// with a new port a few times before giving up.
func listen() (net.PacketConn, net.Listener, error) {
	var lastErr error
	for range 20 {
		udp, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			return nil, nil, err
		}
		tcp, err := net.Listen("tcp4", udp.LocalAddr().String())
		if err == nil {
			return udp, tcp, nil
		}
		udp.Close()
		lastErr = err
	}
	return nil, nil, lastErr
}

// Addr is "127.0.0.1:port".
func (d *DNS) Addr() string { return d.addr }

// Set makes name (any case, with or without a trailing dot) answer with addrs (IPv4 → A, IPv6 → AAAA). Later calls replace.
//
// An IPv4-mapped IPv6 address (::ffff:127.0.0.1) is IPv6, so an AAAA answer: it is how a AAAA
// record can hide an IPv4 destination, which a test may want to serve. With no addrs the name
// exists but has no addresses. An invalid (zero) netip.Addr panics, being a mistake in the test.
func (d *DNS) Set(name string, addrs ...netip.Addr) {
	d.Sequence(name, addrs)
}

// Sequence makes name answer with answers[0] at the first query of each type, answers[1] at the second, ... and the last one after that (for DNS rebinding tests).
//
// The count is per type because a resolver asking for both families sends an A and an AAAA query
// for one lookup: counting them together would make one lookup use two steps. Like Set, it replaces
// what name had, and the count starts again. With no answers the name exists with no addresses.
// A UDP reply too big to send, truncated so that the client asks again over TCP, does not count.
func (d *DNS) Sequence(name string, answers ...[]netip.Addr) {
	e := &entry{seen: make(map[dnsmessage.Type]int)}
	for _, addrs := range answers {
		for _, a := range addrs {
			if !a.IsValid() {
				panic("egresstest: DNS.Set/Sequence of " + name + " with an invalid netip.Addr")
			}
		}
		// Copied so that a test changing its slice afterwards does not change the answers.
		e.answers = append(e.answers, append([]netip.Addr(nil), addrs...))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.names[canonical(name)] = e
}

// Queries returns how many queries (of any type) name has had.
//
// It counts the queries the server received, names in the table or not, since the server started:
// Set and Sequence do not reset it. A resolver looking up both families sends two queries, and one
// that retries (over TCP after a truncated UDP answer, say) sends more.
func (d *DNS) Queries(name string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.queries[canonical(name)]
}

// Resolver returns a *net.Resolver (PreferGo, its Dial always to d) that uses this server.
//
// Whatever server the system configuration names, the resolver dials d, over UDP or TCP as it
// asks. It still reads /etc/hosts and the search list of /etc/resolv.conf, as Go's resolver does:
// a name ending in a dot is never looked up with a search suffix.
func (d *DNS) Resolver() *net.Resolver {
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var dialer net.Dialer
			return dialer.DialContext(ctx, network, d.addr)
		},
	}
}

// canonical is the form names are kept in: lower case, since DNS names compare without case, and
// with the trailing dot, which is how names are written in queries.
func canonical(name string) string {
	name = strings.ToLower(name)
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	return name
}

// close stops the server and waits for its goroutines, so that a test ends with none left.
func (d *DNS) close() {
	d.mu.Lock()
	d.closed = true
	// Closing the sockets makes the blocked reads and Accept return; connections are closed too
	// because their goroutines would otherwise wait for the client to hang up.
	d.udp.Close()
	d.tcp.Close()
	for c := range d.conns {
		c.Close()
	}
	d.mu.Unlock()
	d.wg.Wait()
}

// serveUDP answers UDP queries until the socket is closed.
func (d *DNS) serveUDP() {
	defer d.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := d.udp.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // a transient error about one datagram: keep serving the others
		}
		if resp := d.answer(buf[:n], true); resp != nil {
			d.udp.WriteTo(resp, from) // a lost reply is the client's to retry, as over a real network
		}
	}
}

// serveTCP accepts TCP connections until the listener is closed.
func (d *DNS) serveTCP() {
	defer d.wg.Done()
	for {
		c, err := d.tcp.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		d.mu.Lock()
		if d.closed {
			// Accepted as close was running: close has already gone through the connections.
			d.mu.Unlock()
			c.Close()
			return
		}
		d.conns[c] = struct{}{}
		d.wg.Add(1)
		d.mu.Unlock()
		go d.serveConn(c)
	}
}

// serveConn answers the queries of one TCP connection, each a two-byte length then the message
// (RFC 1035 4.2.2), until the client hangs up or the server closes.
func (d *DNS) serveConn(c net.Conn) {
	defer d.wg.Done()
	defer func() {
		d.mu.Lock()
		delete(d.conns, c)
		d.mu.Unlock()
		c.Close()
	}()
	var size [2]byte
	for {
		if _, err := io.ReadFull(c, size[:]); err != nil {
			return
		}
		msg := make([]byte, binary.BigEndian.Uint16(size[:]))
		if _, err := io.ReadFull(c, msg); err != nil {
			return
		}
		resp := d.answer(msg, false)
		if resp == nil {
			continue // malformed: the framing is intact, so the next message can still be read
		}
		out := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(resp)), uint16(len(resp)))
		if _, err := c.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

// answer is the reply to the query msg, or nil for anything that is not a well-formed query, which
// the server ignores as a real one would rather than guess at a reply.
func (d *DNS) answer(msg []byte, udp bool) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil || h.Response || h.OpCode != 0 {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return nil
	}
	q := qs[0]
	// The reply must fit in what the client reads: 512 bytes over UDP (RFC 1035), or the size an
	// EDNS(0) record in the query offers (RFC 6891). Go's resolver sends one offering 1232.
	limit := 512
	edns := false
	if err := p.SkipAllAnswers(); err != nil {
		return nil
	}
	if err := p.SkipAllAuthorities(); err != nil {
		return nil
	}
	for {
		rh, err := p.AdditionalHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			break
		}
		if err != nil {
			return nil
		}
		if rh.Type == dnsmessage.TypeOPT {
			edns = true
			limit = max(limit, int(rh.Class)) // an OPT record's class is the offered size
		}
		if err := p.SkipAdditional(); err != nil {
			return nil
		}
	}

	name := canonical(q.Name.String())
	// Held from choosing the answer to counting it, so that concurrent queries each take their own
	// step of a sequence.
	d.mu.Lock()
	defer d.mu.Unlock()
	d.queries[name]++
	rcode, addrs, e := d.pick(name, q.Type)
	resp, err := build(h.ID, h.RecursionDesired, q, rcode, addrs, edns, false)
	if err != nil {
		return nil
	}
	if udp && len(resp) > limit {
		// Too big for UDP: an empty reply with the truncated bit tells the client to ask again
		// over TCP. The step is not used up, so that the TCP query gets the answer this one lacked.
		if resp, err = build(h.ID, h.RecursionDesired, q, rcode, nil, edns, true); err != nil {
			return nil
		}
		return resp
	}
	if e != nil {
		e.seen[q.Type]++
	}
	return resp
}

// pick is the answer to a query of name: the addresses of the query's type at the step of the
// sequence this query is at, or NXDOMAIN for a name not in the table. It returns the entry the
// answer came from, if any. d.mu must be held.
func (d *DNS) pick(name string, qtype dnsmessage.Type) (dnsmessage.RCode, []netip.Addr, *entry) {
	e, ok := d.names[name]
	if !ok {
		return dnsmessage.RCodeNameError, nil, nil
	}
	if qtype != dnsmessage.TypeA && qtype != dnsmessage.TypeAAAA || len(e.answers) == 0 {
		return dnsmessage.RCodeSuccess, nil, nil
	}
	step := min(e.seen[qtype], len(e.answers)-1)
	var addrs []netip.Addr
	for _, a := range e.answers[step] {
		if a.Is4() == (qtype == dnsmessage.TypeA) {
			addrs = append(addrs, a)
		}
	}
	return dnsmessage.RCodeSuccess, addrs, e
}

// build packs a reply to the question q.
func build(id uint16, rd bool, q dnsmessage.Question, rcode dnsmessage.RCode, addrs []netip.Addr, edns, truncated bool) ([]byte, error) {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{
		ID:               id,
		Response:         true,
		RecursionDesired: rd,
		// Authoritative, and claiming recursion: Go's resolver takes an empty answer from a
		// server that is neither for a referral it cannot follow, and moves on to the next server
		// instead of reporting that the name has no such address.
		Authoritative:      true,
		RecursionAvailable: true,
		Truncated:          truncated,
		RCode:              rcode,
	})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	// The question goes back as it came, case included: a resolver checks the reply is to its question.
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	for _, a := range addrs {
		rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 0}
		var err error
		if a.Is4() {
			err = b.AResource(rh, dnsmessage.AResource{A: a.As4()})
		} else {
			err = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
		if err != nil {
			return nil, err
		}
	}
	if edns {
		// A client that spoke EDNS(0) hears it back (RFC 6891 7), offering the same 1232 bytes
		// Go's resolver does.
		if err := b.StartAdditionals(); err != nil {
			return nil, err
		}
		var rh dnsmessage.ResourceHeader
		if err := rh.SetEDNS0(1232, dnsmessage.RCodeSuccess, false); err != nil {
			return nil, err
		}
		if err := b.OPTResource(rh, dnsmessage.OPTResource{}); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}
