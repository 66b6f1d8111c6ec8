package apierror

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestEnded(t *testing.T) {
	shutdown := &Error{Status: 503, Type: "server_error", Message: "shutting down"}
	for _, tt := range []struct {
		name string
		ctx  func() context.Context
		want *Error
	}{
		{"live", func() context.Context { return context.Background() }, nil},
		{"client left", func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}, nil},
		{"cause of another kind", func() context.Context {
			ctx, cancel := context.WithCancelCause(context.Background())
			cancel(errors.New("not for clients"))
			return ctx
		}, nil},
		{"ended by the server, seen from a child", func() context.Context {
			ctx, cancel := context.WithCancelCause(context.Background())
			child, stop := context.WithCancel(ctx)
			t.Cleanup(stop)
			cancel(fmt.Errorf("draining: %w", shutdown))
			return child
		}, shutdown},
	} {
		if got := Ended(tt.ctx()); got != tt.want {
			t.Errorf("%s: Ended = %v; want %v", tt.name, got, tt.want)
		}
	}
}
