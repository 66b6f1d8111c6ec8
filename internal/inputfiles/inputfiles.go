// Package inputfiles reads the proxy's Files API files that a /v1/responses input names by
// file_id into what any upstream can read: an input_image part's image as a data URL, an
// input_file part's file as inline file_data. The interception engine uses its readers and its
// walk over the input's parts; Inline is the whole rewrite for a request that passes through to a
// Responses upstream, which has never heard of the proxy's ids, with the files streamed from the
// store as the request is sent rather than held; Budget bounds the bytes both inline at once
// (docs/files.md).
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
	o, err := openImage(ctx, files, owner, id, param, left)
	if err != nil {
		return "", o.f, 0, err
	}
	return o.dataURL()
}

// openImage opens owner's image id for an input_image part, checked as ImageURL says.
func openImage(ctx context.Context, files Store, owner, id, param string, left int64) (opened, error) {
	limit := min(int64(MaxImageBytes), left)
	tooLarge := func() error {
		if limit < MaxImageBytes {
			return apierror.BadRequest(fmt.Sprintf("The images by file_id take more than %d MB together in this request.", MaxInputImageBytes>>20), param, apierror.CodeImageFileTooLarge)
		}
		return apierror.BadRequest(fmt.Sprintf("The image file %s is larger than %d MB.", id, MaxImageBytes>>20), param, apierror.CodeImageFileTooLarge)
	}
	typeOf := func(f store.File, head []byte) (string, error) {
		if len(head) == 0 {
			return "", apierror.BadRequest("The image file "+id+" is empty.", param, apierror.CodeEmptyImageFile)
		}
		typ := http.DetectContentType(head)
		if !slices.Contains(imageTypes, typ) {
			return "", apierror.BadRequest("The file "+id+" ("+f.Filename+") is not an image of a supported type: PNG, JPEG, GIF or WebP.", param, apierror.CodeUnsupportedImageMediaType)
		}
		return typ, nil
	}
	return openChecked(ctx, files, owner, id, limit, tooLarge, typeOf)
}

// FileDataURL reads owner's file id for an input_file part as a data URL of its type, and returns
// it with the file and its size. The file may take left bytes (what the request's files have
// left) and MaxFileBytes. Errors name param; an id owner has no file for is the 404.
func FileDataURL(ctx context.Context, files Store, owner, id, param string, left int64) (string, store.File, int64, error) {
	o, err := openInputFile(ctx, files, owner, id, param, left)
	if err != nil {
		if notFound(err) {
			err = FileError(err, id, param)
		}
		return "", o.f, 0, err
	}
	return o.dataURL()
}

// openInputFile opens owner's file id for an input_file part, checked as FileDataURL says.
func openInputFile(ctx context.Context, files Store, owner, id, param string, left int64) (opened, error) {
	limit := min(int64(MaxFileBytes), left)
	tooLarge := func() error {
		if limit < MaxFileBytes {
			return apierror.BadRequest(fmt.Sprintf("The input files by file_id take more than %d MB together in this request.", MaxInputFileBytes>>20), param, apierror.CodeFileTooLarge)
		}
		return apierror.BadRequest(fmt.Sprintf("The file %s is larger than %d MB, the most an input_file may carry.", id, MaxFileBytes>>20), param, apierror.CodeFileTooLarge)
	}
	return openChecked(ctx, files, owner, id, limit, tooLarge, func(f store.File, head []byte) (string, error) {
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

// opened is a stored file checked for a data URL and open past its first bytes.
type opened struct {
	id    string
	f     store.File
	typ   string        // the data URL's media type
	head  []byte        // the file's first bytes, read to learn typ
	rest  io.ReadCloser // the file past head
	limit int64         // the most it may hold
	large func() error  // the error of a file over limit
}

// openChecked opens owner's file id, refuses it when the store says it holds more than limit
// bytes (tooLarge), and reads its first bytes, from which and the file typeOf gives the data
// URL's type. An id owner has no file for is the store's error. The caller closes rest.
func openChecked(ctx context.Context, files Store, owner, id string, limit int64, tooLarge func() error,
	typeOf func(store.File, []byte) (string, error)) (opened, error) {
	if files == nil {
		return opened{}, store.ErrNotFound
	}
	f, rc, err := files.OpenFile(ctx, owner, id)
	if err != nil {
		return opened{f: f}, err
	}
	if f.Bytes > limit {
		rc.Close()
		return opened{f: f}, tooLarge()
	}
	head := make([]byte, 512) // what http.DetectContentType reads
	nh, err := io.ReadFull(rc, head)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		rc.Close()
		return opened{f: f}, fmt.Errorf("reading file %s: %w", id, err)
	}
	typ, err := typeOf(f, head[:nh])
	if err != nil {
		rc.Close()
		return opened{f: f}, err
	}
	return opened{id: id, f: f, typ: typ, head: head[:nh], rest: rc, limit: limit, large: tooLarge}, nil
}

// dataURL reads the rest of the file, at most the limit (more is its error), into a data URL,
// and closes it. It returns the URL, the file and the number of bytes read.
func (o opened) dataURL() (string, store.File, int64, error) {
	defer o.rest.Close()
	// The whole URL is built in one buffer, the size the store announces (at most the limit).
	var b strings.Builder
	b.Grow(len("data:;base64,") + len(o.typ) + base64.StdEncoding.EncodedLen(int(max(o.f.Bytes, int64(len(o.head))))))
	b.WriteString("data:" + o.typ + ";base64,")
	enc := base64.NewEncoder(base64.StdEncoding, &b)
	_, _ = enc.Write(o.head) // a strings.Builder does not fail
	n, err := io.Copy(enc, io.LimitReader(o.rest, o.limit+1-int64(len(o.head))))
	if err != nil {
		return "", o.f, 0, fmt.Errorf("reading file %s: %w", o.id, err)
	}
	if n += int64(len(o.head)); n > o.limit {
		return "", o.f, 0, o.large()
	}
	_ = enc.Close()
	return b.String(), o.f, n, nil
}
