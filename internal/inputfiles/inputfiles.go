// Package inputfiles reads the proxy's Files API files that a /v1/responses input names by
// file_id into what any upstream can read: an input_image part's image as a data URL, an
// input_file part's file as inline file_data. The interception engine uses its readers and its
// walk over the input's parts; Inline is the whole rewrite for a request that passes through to a
// Responses upstream, which has never heard of the proxy's ids (docs/files.md).
package inputfiles

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/store"
)

// The bytes read into one request are bounded. Images: one image, all of a request's, and their
// number (the last two OpenAI's bounds on a request's images). Files: one input_file and all of a
// request's, 50 MB as OpenAI's bound on the files of one request.
const (
	MaxImageBytes      = 20 << 20
	MaxInputImageBytes = 50 << 20
	MaxInputImages     = 500
	MaxFileBytes       = 50 << 20
	MaxInputFileBytes  = 50 << 20
)

// imageTypes are the image types an upstream is given, those OpenAI accepts.
var imageTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// Store is what reading files needs of the Files API's store: the caller's files by id, and
// their bytes. The embedded store implements it.
type Store interface {
	File(ctx context.Context, owner, id string) (store.File, error)
	OpenFile(ctx context.Context, owner, id string) (store.File, io.ReadCloser, error)
}

// Part is one content part of a request's input that may name a file: in a message's content,
// or in the output list of a function_call_output item.
type Part struct {
	Item  int    // the input item's index
	Field string // the item's list of parts: "content" (a message) or "output" (a function_call_output)
	Index int    // the part's index in Field
	Value gjson.Result
}

// Param is where the request holds the part, for errors: input[2].output[1].
func (p Part) Param() string {
	return "input[" + strconv.Itoa(p.Item) + "]." + p.Field + "[" + strconv.Itoa(p.Index) + "]"
}

// ForEachPart calls fn with each part of input's messages and function_call_output items, in
// order, until fn returns false. A string content or output has no parts.
func ForEachPart(input gjson.Result, fn func(Part) bool) {
	k := -1
	more := true
	input.ForEach(func(_, it gjson.Result) bool {
		k++
		field := "content"
		switch typ := it.Get("type").String(); {
		case typ == "message", typ == "" && it.Get("role").Exists():
		case typ == "function_call_output":
			field = "output"
		default:
			return true
		}
		j := -1
		it.Get(field).ForEach(func(_, p gjson.Result) bool {
			j++
			more = fn(Part{Item: k, Field: field, Index: j, Value: p})
			return more
		})
		return more
	})
}

// FileError is the error of a Files API lookup of id, named by param: a 404 for an id the caller
// has no file for.
func FileError(err error, id, param string) error {
	if notFound(err) {
		return apierror.NotFound("No such File object: "+id, param)
	}
	return fmt.Errorf("reading file %s: %w", id, err)
}

// notFound reports whether err says that the caller has no such file.
func notFound(err error) bool {
	return errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrInvalid)
}

// ImageURL reads owner's image id and returns it as a data URL, and its size. The image may take
// left bytes (what the request's images have left) and MaxImageBytes; its type is the one its
// bytes show, and must be one an upstream takes. Errors name param; an id owner has no file for
// is the 404.
func ImageURL(ctx context.Context, files Store, owner, id, param string, left int64) (string, int64, error) {
	url, _, n, err := readImage(ctx, files, owner, id, param, left)
	if err != nil && notFound(err) {
		return "", 0, FileError(err, id, param)
	}
	return url, n, err
}

// readImage is ImageURL, with the store's not-found error as it is.
func readImage(ctx context.Context, files Store, owner, id, param string, left int64) (string, store.File, int64, error) {
	limit := min(int64(MaxImageBytes), left)
	tooLarge := func() error {
		if limit < MaxImageBytes {
			return apierror.BadRequest(fmt.Sprintf("The images by file_id take more than %d MB together in this request.", MaxInputImageBytes>>20), param, "image_file_too_large")
		}
		return apierror.BadRequest(fmt.Sprintf("The image file %s is larger than %d MB.", id, MaxImageBytes>>20), param, "image_file_too_large")
	}
	typeOf := func(f store.File, head []byte) (string, error) {
		if len(head) == 0 {
			return "", apierror.BadRequest("The image file "+id+" is empty.", param, "empty_image_file")
		}
		typ := http.DetectContentType(head)
		if !slices.Contains(imageTypes, typ) {
			return "", apierror.BadRequest("The file "+id+" ("+f.Filename+") is not an image of a supported type: PNG, JPEG, GIF or WebP.", param, "unsupported_image_media_type")
		}
		return typ, nil
	}
	return readDataURL(ctx, files, owner, id, limit, tooLarge, typeOf)
}

// FileDataURL reads owner's file id for an input_file part as a data URL of its type, and returns
// it with the file and its size. The file may take left bytes (what the request's files have
// left) and MaxFileBytes. Errors name param; an id owner has no file for is the 404.
func FileDataURL(ctx context.Context, files Store, owner, id, param string, left int64) (string, store.File, int64, error) {
	url, f, n, err := readFile(ctx, files, owner, id, param, left)
	if err != nil && notFound(err) {
		return "", f, 0, FileError(err, id, param)
	}
	return url, f, n, err
}

// readFile is FileDataURL, with the store's not-found error as it is.
func readFile(ctx context.Context, files Store, owner, id, param string, left int64) (string, store.File, int64, error) {
	limit := min(int64(MaxFileBytes), left)
	tooLarge := func() error {
		if limit < MaxFileBytes {
			return apierror.BadRequest(fmt.Sprintf("The input files by file_id take more than %d MB together in this request.", MaxInputFileBytes>>20), param, "file_too_large")
		}
		return apierror.BadRequest(fmt.Sprintf("The file %s is larger than %d MB, the most an input_file may carry.", id, MaxFileBytes>>20), param, "file_too_large")
	}
	return readDataURL(ctx, files, owner, id, limit, tooLarge, func(f store.File, head []byte) (string, error) {
		return fileType(f.Filename, head), nil
	})
}

// fileType is the media type of a file named name that starts with head: the one its bytes show
// when they show one (a PDF, an image), else the one its name's extension says, else the bytes'
// generic type. Parameters (charset) are left out: a data URL's ";" separates them from base64.
func fileType(name string, head []byte) string {
	sniffed, _, _ := strings.Cut(http.DetectContentType(head), ";")
	switch sniffed {
	case "application/octet-stream", "text/plain", "application/zip":
		if byName, _, _ := strings.Cut(mime.TypeByExtension(fileExt(name)), ";"); byName != "" {
			return strings.TrimSpace(byName)
		}
	}
	return sniffed
}

// fileExt is name's extension, with its dot ("" for none).
func fileExt(name string) string {
	if i := strings.LastIndexByte(name, '.'); i > 0 {
		return name[i:]
	}
	return ""
}

// readDataURL reads owner's file id, at most limit bytes of it (more is tooLarge), into a data URL
// whose type typeOf gives from the file and its first bytes. It returns the URL, the file and the
// number of bytes read; an id owner has no file for is the store's error.
func readDataURL(ctx context.Context, files Store, owner, id string, limit int64, tooLarge func() error,
	typeOf func(store.File, []byte) (string, error)) (string, store.File, int64, error) {
	if files == nil {
		return "", store.File{}, 0, store.ErrNotFound
	}
	f, rc, err := files.OpenFile(ctx, owner, id)
	if err != nil {
		return "", f, 0, err
	}
	defer rc.Close()
	if f.Bytes > limit {
		return "", f, 0, tooLarge()
	}
	src := io.LimitReader(rc, limit+1)
	head := make([]byte, 512) // what http.DetectContentType reads
	nh, err := io.ReadFull(src, head)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return "", f, 0, fmt.Errorf("reading file %s: %w", id, err)
	}
	head = head[:nh]
	typ, err := typeOf(f, head)
	if err != nil {
		return "", f, 0, err
	}
	// The whole URL is built in one buffer, the size the store announces (at most limit).
	var b strings.Builder
	b.Grow(len("data:;base64,") + len(typ) + base64.StdEncoding.EncodedLen(int(max(f.Bytes, int64(nh)))))
	b.WriteString("data:" + typ + ";base64,")
	enc := base64.NewEncoder(base64.StdEncoding, &b)
	_, _ = enc.Write(head) // a strings.Builder does not fail
	n, err := io.Copy(enc, src)
	if err != nil {
		return "", f, 0, fmt.Errorf("reading file %s: %w", id, err)
	}
	if n += int64(nh); n > limit {
		return "", f, 0, tooLarge()
	}
	_ = enc.Close()
	return b.String(), f, n, nil
}
