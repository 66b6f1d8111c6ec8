package upstream

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/ciproxy/ciproxy/internal/config"
)

// Streamed is a JSON request body too large to hold whole: JSON, in which each hole's Mark
// stands, once and in the holes' order, for the Size bytes its Open gives. Each attempt opens the
// holes again as it reaches them (a failover, the transport's retry), so no attempt holds more
// than a copy buffer of them. The deployment's changes to the body (DeploymentBody) are made to
// JSON, which must keep the marks.
type Streamed struct {
	JSON  []byte
	Holes []Hole
}

// Hole is a part of a Streamed body that is read when it is sent.
type Hole struct {
	Mark string
	Size int64
	Open func(ctx context.Context) (io.ReadCloser, error)
}

// sendable is one deployment's body: the bytes between the holes (one more than the holes) and
// the holes.
type sendable struct {
	parts [][]byte
	holes []Hole
	size  int64
}

// forDeployment is b as sent to d for a request to urlPath.
func (b Streamed) forDeployment(d config.Deployment, urlPath string) (sendable, error) {
	sent := DeploymentBody(d, urlPath, b.JSON)
	s := sendable{holes: b.Holes, parts: make([][]byte, 0, len(b.Holes)+1)}
	for _, h := range b.Holes {
		i := bytes.Index(sent, []byte(h.Mark))
		if i < 0 {
			return sendable{}, fmt.Errorf("building the body for %s: a streamed part's mark is missing", d.Name())
		}
		s.parts = append(s.parts, sent[:i])
		s.size += int64(i) + h.Size
		sent = sent[i+len(h.Mark):]
	}
	s.parts = append(s.parts, sent)
	s.size += int64(len(sent))
	return s, nil
}

// setBody makes s req's body, read afresh by each GetBody.
func (s sendable) setBody(req *http.Request) {
	if s.size == 0 {
		return
	}
	if len(s.holes) == 0 {
		rd := bytes.NewReader(s.parts[0])
		req.Body, req.ContentLength = io.NopCloser(rd), int64(rd.Len())
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(s.parts[0])), nil }
		return
	}
	ctx := req.Context()
	req.Body, req.ContentLength = &holeReader{ctx: ctx, s: s}, s.size
	req.GetBody = func() (io.ReadCloser, error) { return &holeReader{ctx: ctx, s: s}, nil }
}

// holeReader reads a sendable: its parts, and between them its holes, each opened when reached
// and closed at its end, so one attempt has one hole open at a time.
type holeReader struct {
	ctx  context.Context
	s    sendable
	next int       // the next segment: part next/2 when even, hole next/2 when odd
	cur  io.Reader // the segment being read; nil between segments
	open io.Closer // the hole being read
}

func (r *holeReader) Read(p []byte) (int, error) {
	for {
		if r.cur == nil {
			switch {
			case r.next > 2*len(r.s.holes):
				return 0, io.EOF
			case r.next%2 == 0:
				r.cur = bytes.NewReader(r.s.parts[r.next/2])
			default:
				rc, err := r.s.holes[r.next/2].Open(r.ctx)
				if err != nil {
					return 0, err
				}
				r.cur, r.open = rc, rc
			}
		}
		n, err := r.cur.Read(p)
		if err == io.EOF {
			r.closeHole()
			r.cur, r.next = nil, r.next+1
			err = nil
		}
		if n > 0 || err != nil {
			return n, err
		}
	}
}

func (r *holeReader) closeHole() {
	if r.open != nil {
		_ = r.open.Close()
		r.open = nil
	}
}

func (r *holeReader) Close() error {
	r.closeHole()
	return nil
}
