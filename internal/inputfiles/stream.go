package inputfiles

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
)

// Stream is one file of an Inlined body, sent as it is read from the store rather than held:
// Mark, in Inlined.Body, stands for Size bytes that Open gives, the base64 of the stored file.
type Stream struct {
	Mark string
	Size int64
	Open func(ctx context.Context) (io.ReadCloser, error)
}

// stream is the Stream of owner's file id of size bytes, opened again for each read of the body
// (an upstream attempt, a retry).
func stream(files Store, owner, id, param, mark string, size int64) Stream {
	return Stream{Mark: mark, Size: int64(base64.StdEncoding.EncodedLen(int(size))), Open: func(ctx context.Context) (io.ReadCloser, error) {
		f, rc, err := files.OpenFile(ctx, owner, id)
		switch {
		case err != nil && notFound(err):
			return nil, FileError(err, id, param) // deleted since the request was read
		case err != nil:
			return nil, fmt.Errorf("reading file %s: %w", id, err)
		case f.Bytes != size:
			rc.Close()
			return nil, fmt.Errorf("reading file %s: it holds %d bytes, not the %d it held when the request was read", id, f.Bytes, size)
		}
		return &base64Reader{src: rc, left: size, id: id}, nil
	}}
}

// base64Reader reads the base64 of exactly left bytes of src, a chunk at a time: it holds one
// chunk, not the file. A src shorter or longer than that is an error, so the reader gives the
// Size its Stream announced or fails.
type base64Reader struct {
	src     io.ReadCloser
	left    int64
	id      string
	raw     [3 << 10]byte // a multiple of 3: chunks encode as the whole file does
	out     [4 << 10]byte
	pending []byte
	done    bool
}

func (b *base64Reader) Read(p []byte) (int, error) {
	for len(b.pending) == 0 {
		if b.left == 0 {
			if !b.done {
				b.done = true
				var one [1]byte
				if n, err := io.ReadFull(b.src, one[:]); n > 0 || !errors.Is(err, io.EOF) {
					return 0, fmt.Errorf("reading file %s: it holds more bytes than the store records (%v)", b.id, err)
				}
			}
			return 0, io.EOF
		}
		n, err := io.ReadFull(b.src, b.raw[:min(int64(len(b.raw)), b.left)])
		if err != nil {
			return 0, fmt.Errorf("reading file %s: %w", b.id, err)
		}
		b.left -= int64(n)
		base64.StdEncoding.Encode(b.out[:], b.raw[:n])
		b.pending = b.out[:base64.StdEncoding.EncodedLen(n)]
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	return n, nil
}

func (b *base64Reader) Close() error { return b.src.Close() }
