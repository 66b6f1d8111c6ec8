package storetest

import (
	"context"
	"io"
	"strings"

	"github.com/ciproxy/ciproxy/internal/store"
)

// MemFiles is the read side of the Files API's store (File and OpenFile) held in memory, for
// tests of code that only reads files by id. A file may claim a size it does not hold (a limit's
// test needs no 50 MB of bytes), and Fail, when set, is what every call returns.
type MemFiles struct {
	meta map[string]map[string]store.File // owner → id → file
	data map[string]string                // id → bytes
	Fail error
}

// NewMemFiles returns an empty MemFiles.
func NewMemFiles() *MemFiles {
	return &MemFiles{meta: map[string]map[string]store.File{}, data: map[string]string{}}
}

// Add gives owner the file id, named name, of data; size is what the store says it takes.
func (m *MemFiles) Add(owner, id, name, data string, size int64) {
	if m.meta[owner] == nil {
		m.meta[owner] = map[string]store.File{}
	}
	m.meta[owner][id] = store.File{ID: id, Owner: owner, Filename: name, Bytes: size}
	m.data[id] = data
}

// File returns owner's file id, or store.ErrNotFound.
func (m *MemFiles) File(_ context.Context, owner, id string) (store.File, error) {
	if m.Fail != nil {
		return store.File{}, m.Fail
	}
	f, ok := m.meta[owner][id]
	if !ok {
		return store.File{}, store.ErrNotFound
	}
	return f, nil
}

// OpenFile returns owner's file id and a reader of its bytes.
func (m *MemFiles) OpenFile(ctx context.Context, owner, id string) (store.File, io.ReadCloser, error) {
	f, err := m.File(ctx, owner, id)
	if err != nil {
		return f, nil, err
	}
	return f, io.NopCloser(strings.NewReader(m.data[id])), nil
}

// Data returns the bytes of file id.
func (m *MemFiles) Data(id string) string { return m.data[id] }
