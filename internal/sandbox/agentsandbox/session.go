package agentsandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox/processv1"
)

// session is this provider's relay to one sandbox's kernel daemon (kerneld.py relay): one Start
// stream kept open, each execution one request line written to its stdin and its replies read
// from its stdout up to end_of_execution. Starting a process per execution costs more than the
// execution of a small cell; the daemon serves the relays of every replica at once, so none holds
// the kernel. One execution at a time goes through a session (turn).
type session struct {
	s    *started
	out  *io.PipeReader
	turn chan struct{} // held by the execution using the session

	mu     sync.Mutex
	stderr strings.Builder // the relay's stderr, its last errBodyLimit bytes
	dead   error           // why the stream ended, once it has
}

// sessionKey names a session: the claim and the pod (a new pod is a new kernel).
func sessionKey(h sandbox.Handle) string { return h.ID + "@" + h.Domain }

// session returns the open session to h's kernel daemon, starting one if there is none or the
// last one ended.
func (p *Provider) session(ctx context.Context, h sandbox.Handle) (*session, error) {
	key := sessionKey(h)
	p.mu.Lock()
	sess := p.sessions[key]
	p.mu.Unlock()
	if sess != nil && sess.err() == nil {
		return sess, nil
	}
	st, err := p.start(ctx, h, "run", p.kernelConfig(h, "relay"))
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	sess = &session{s: st, out: pr, turn: make(chan struct{}, 1)}
	go func() {
		sess.read(pw)
		p.mu.Lock()
		if p.sessions[key] == sess {
			delete(p.sessions, key) // its sandbox gone, or the relay ended: nothing to keep
		}
		p.mu.Unlock()
	}()
	p.mu.Lock()
	if old := p.sessions[key]; old != nil && old.err() == nil {
		// Another execution started one meanwhile: use it, end this one.
		p.mu.Unlock()
		st.cancel()
		return old, nil
	}
	p.sessions[key] = sess
	p.mu.Unlock()
	return sess, nil
}

// read copies the stream's stdout into pw until the stream ends.
func (s *session) read(pw *io.PipeWriter) {
	for {
		ev, err := s.s.stream.Recv()
		if err == nil {
			switch e := ev.GetEvent().(type) {
			case *processv1.StartResponse_Stdout:
				if _, werr := pw.Write(e.Stdout); werr != nil {
					err = werr
				}
			case *processv1.StartResponse_Stderr:
				s.mu.Lock()
				if s.stderr.Len() < errBodyLimit {
					s.stderr.Write(e.Stderr[:min(len(e.Stderr), errBodyLimit-s.stderr.Len())])
				}
				s.mu.Unlock()
			case *processv1.StartResponse_Exit:
				err = fmt.Errorf("the relay exited %d", e.Exit.GetExitCode())
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the relay's stream ended")
			}
			s.mu.Lock()
			if s.dead == nil {
				s.dead = err
			}
			s.mu.Unlock()
			pw.CloseWithError(err)
			return
		}
	}
}

// err is why the session ended, nil while it is open.
func (s *session) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead
}

// why describes the end of a session for an error message.
func (s *session) why() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := strings.TrimSpace(s.stderr.String())
	if s.dead != nil {
		w = strings.TrimSpace(w + " " + s.dead.Error())
	}
	return w
}

// end cuts the session's stream (the relay dies; the daemon interrupts what it was running for
// it) and forgets it.
func (p *Provider) endSession(h sandbox.Handle, s *session) {
	s.s.cancel()
	p.mu.Lock()
	if p.sessions[sessionKey(h)] == s {
		delete(p.sessions, sessionKey(h))
	}
	p.mu.Unlock()
}

// endSessions ends every session to claim id (Delete), or all of them (id "", Close).
func (p *Provider) endSessions(id string) {
	p.mu.Lock()
	var ended []*session
	for k, s := range p.sessions {
		if id == "" || strings.HasPrefix(k, id+"@") {
			ended = append(ended, s)
			delete(p.sessions, k)
		}
	}
	p.mu.Unlock()
	for _, s := range ended {
		s.s.cancel()
	}
}
