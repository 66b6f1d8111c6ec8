package embedded

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
)

// TestContainerRecordFormat: a container record in the form the store has always written
// (containers/<id>.json) reads back as the container it describes, and a container is written in
// that same form, byte for byte, so that a data directory moves between versions either way.
func TestContainerRecordFormat(t *testing.T) {
	at := time.Date(2026, 8, 21, 11, 0, 0, 0, time.UTC)
	const id = "cntr_01a0242b0e80000000000000000000000000000000000001"
	for _, tc := range []struct {
		name   string
		record string
		want   store.Container
	}{
		{
			"every field",
			`{"id":"cntr_01a0242b0e80000000000000000000000000000000000001","owner":"alice","name":"scratch","backend":"local","tool":"python","handle":"eyJpZCI6InNieC0xIn0=","host":"replica-1","memory_limit":"4g","status":"running","idle_timeout_ns":1200000000000,"created_at":"2026-08-21T11:00:00Z","last_active_at":"2026-08-21T11:50:00Z","expires_at":"2026-08-21T12:10:00Z","forget_at":"2026-08-22T12:00:00Z","version":3}`,
			store.Container{ID: id, Owner: "alice", Name: "scratch", Backend: "local", Tool: "python", Handle: []byte(`{"id":"sbx-1"}`),
				Host: "replica-1", MemoryLimit: "4g", Status: "running", IdleTimeout: 20 * time.Minute, CreatedAt: at,
				LastActiveAt: at.Add(50 * time.Minute), ExpiresAt: at.Add(70 * time.Minute), ForgetAt: at.Add(25 * time.Hour), Version: 3},
		},
		{
			"the fields every record has",
			`{"id":"cntr_01a0242b0e80000000000000000000000000000000000001","owner":"bob","created_at":"2026-08-21T11:00:00Z","version":1}`,
			store.Container{ID: id, Owner: "bob", CreatedAt: at, Version: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := storetest.NewClock()
			dir := t.TempDir()
			if err := open(t, dir, clock).Close(); err != nil { // lays out the data directory
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, dirContainers, id+".json"), []byte(tc.record), fileMode); err != nil {
				t.Fatal(err)
			}
			got, err := open(t, dir, clock).Container(context.Background(), tc.want.Owner, id)
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Container = %+v, %v; want %+v", got, err, tc.want)
			}
			if b, err := json.Marshal(tc.want); err != nil || string(b) != tc.record {
				t.Errorf("the record written is\n%s (%v); want\n%s", b, err, tc.record)
			}
		})
	}
}
