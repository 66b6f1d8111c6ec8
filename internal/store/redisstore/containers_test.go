package redisstore

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
	"github.com/ciproxy/ciproxy/internal/testutil/redisserver"
)

// TestContainerRecordFormat: a container's hash (cntr:<id>) in the form the store has always
// written reads back as the container it describes, and its r field is written in that same form,
// byte for byte, so that replicas of either version read each other's records.
func TestContainerRecordFormat(t *testing.T) {
	ctx := context.Background()
	s := open(t, redisserver.Start(t), Options{Now: storetest.NewClock().Now})
	at := time.Date(2026, 8, 21, 11, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		fields []any // the hash's fields but r, as create_container.lua and update_container.lua write them
		rest   string
		want   store.Container
	}{
		{
			"every field",
			[]any{"o", "alice", "v", 3, "c", "2026-08-21T11:00:00Z", "f", 1787400000000, "e", 1787314200000},
			`{"name":"scratch","backend":"local","tool":"python","handle":"eyJpZCI6InNieC0xIn0=","host":"replica-1","memory_limit":"4g","status":"running","idle_timeout_ns":1200000000000,"last_active_at":"2026-08-21T11:50:00Z","expires_at":"2026-08-21T12:10:00Z","forget_at":"2026-08-22T12:00:00Z"}`,
			store.Container{ID: "cntr_01a0242b0e80000000000000000000000000000000000001", Owner: "alice", Name: "scratch", Backend: "local",
				Tool: "python", Handle: []byte(`{"id":"sbx-1"}`), Host: "replica-1", MemoryLimit: "4g", Status: "running",
				IdleTimeout: 20 * time.Minute, CreatedAt: at, LastActiveAt: at.Add(50 * time.Minute), ExpiresAt: at.Add(70 * time.Minute),
				ForgetAt: at.Add(25 * time.Hour), Version: 3},
		},
		{
			"the fields every record has",
			[]any{"o", "bob", "v", 1, "c", "2026-08-21T11:00:00Z", "f", 0, "e", 0},
			`{}`,
			store.Container{ID: "cntr_01a0242b0e80000000000000000000000000000000000002", Owner: "bob", CreatedAt: at, Version: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fields := append(tc.fields, "ix", s.ownerKey(tc.want.Owner, "cntrs"), "r", tc.rest)
			if err := s.rdb.HSet(ctx, s.key("cntr", tc.want.ID), fields...).Err(); err != nil {
				t.Fatal(err)
			}
			got, err := s.Container(ctx, tc.want.Owner, tc.want.ID)
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Container = %+v, %v; want %+v", got, err, tc.want)
			}
			if b, err := containerRest(tc.want); err != nil || string(b) != tc.rest {
				t.Errorf("the r field written is\n%s (%v); want\n%s", b, err, tc.rest)
			}
		})
	}
}
