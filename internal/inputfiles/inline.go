package inputfiles

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
)

// Inline looks further only into a body that holds fileIDKey, or a \u escape, which can spell the
// key without its bytes ("file\u005fid"; gjson reads such keys as the key itself). Bodies escaped
// throughout (Python's json.dumps escapes every non-ASCII character) pay the walk.
var (
	fileIDKey     = []byte("file_id")
	unicodeEscape = []byte(`\u`)
)

// Inlined is a request body with files inlined: Body, in which each stream's Mark stands for
// the stream's bytes, the base64 of a stored file inside its data URL. Bytes is what the files
// take in the store: what the request sends of them.
type Inlined struct {
	Body    []byte
	Streams []Stream
	Bytes   int64
}

// Inline returns body, a POST /v1/responses body that goes to a Responses upstream as it is,
// with the input parts that name one of owner's Files API files by file_id carrying that file
// instead, since the upstream cannot know the proxy's ids: an input_image {file_id} becomes
// {image_url: data URL}, an input_file {file_id} becomes {file_data: data URL, filename}, in
// messages' content and in function_call_output output lists. Every other byte is the client's.
//
// The files are not read here beyond their first bytes (their type): the data URLs' payloads
// are Streams, which read the store each time the body is sent, so a request holds no file
// whatever their size.
//
// An id that is not one of owner's files (an id the upstream issued itself, or another owner's,
// which owner must not read) is left as sent. A body with neither "file_id" nor a \u escape
// costs two scans of its bytes and comes back as it is, with no stream. Files over the limits
// are the 400 naming the part's file_id; an error that is not an *apierror.Error is the store's.
func Inline(ctx context.Context, files Store, owner string, body []byte) (Inlined, error) {
	out := Inlined{Body: body}
	if files == nil || !bytes.Contains(body, fileIDKey) && !bytes.Contains(body, unicodeEscape) {
		return out, nil
	}
	input := gjson.GetBytes(body, "input")
	if !input.IsArray() {
		return out, nil
	}
	var (
		edits               []edit
		err                 error
		images              int
		imageLeft, fileLeft int64 = MaxInputImageBytes, MaxInputFileBytes
		token               string
	)
	ForEachPart(input, func(p Part) bool {
		typ := p.Value.Get("type").String()
		if typ != "input_image" && typ != "input_file" {
			return true
		}
		id := p.Value.Get("file_id")
		if id.Type != gjson.String || !strings.HasPrefix(id.Str, "file-") {
			return true
		}
		param := p.Param() + ".file_id"
		var o opened
		if typ == "input_image" {
			if images++; images > MaxInputImages {
				err = apierror.BadRequest(fmt.Sprintf("Too many images by file_id: more than %d per request.", MaxInputImages), "input", "")
				return false
			}
			o, err = openImage(ctx, files, owner, id.Str, param, imageLeft)
		} else {
			o, err = openInputFile(ctx, files, owner, id.Str, param, fileLeft)
		}
		switch {
		case err != nil && notFound(err):
			if typ == "input_image" {
				images-- // not one of ours: the upstream's business
			}
			err = nil
			return true
		case err != nil:
			err = FileError(err, id.Str, param)
			return false
		}
		o.rest.Close()
		size := o.f.Bytes // what each send reads, exactly
		if token == "" {
			token = markToken(body)
		}
		mark := token + strconv.Itoa(len(out.Streams)) + "-" // "-1-" is no prefix of "-10-"
		url := "data:" + o.typ + ";base64," + mark
		var part string
		if typ == "input_image" {
			imageLeft -= size
			part, err = replace(p.Value.Raw, "image_url", url, "")
		} else {
			fileLeft -= size
			name := o.f.Filename
			if p.Value.Get("filename").Type == gjson.String {
				name = "" // the client's stays
			}
			part, err = replace(p.Value.Raw, "file_data", url, name)
		}
		if err != nil {
			return false
		}
		edits = append(edits, edit{at: p.Value.Index, raw: p.Value.Raw, part: part})
		out.Streams = append(out.Streams, stream(files, owner, id.Str, param, mark, size))
		out.Bytes += size
		return true
	})
	if err != nil {
		return Inlined{}, err
	}
	if out.Body, err = splice(body, edits); err != nil {
		return Inlined{}, err
	}
	return out, nil
}

// markToken returns the start of the marks of a body's streams: random, so that no client can
// write one, and checked against body all the same.
func markToken(body []byte) string {
	for {
		t := "ciproxy-inline-" + rand.Text() + "-"
		if !bytes.Contains(body, []byte(t)) {
			return t
		}
	}
}

// replace returns the part raw without its file_id and with field set to url, and filename set
// to name unless name is "".
func replace(raw, field, url, name string) (string, error) {
	out, err := sjson.Delete(raw, "file_id")
	if err == nil && name != "" {
		out, err = sjson.Set(out, "filename", name)
	}
	if err == nil {
		out, err = sjson.Set(out, field, url)
	}
	if err != nil {
		return "", fmt.Errorf("rewriting an input part: %w", err)
	}
	return out, nil
}

// edit replaces the bytes raw, at offset at of the body, with part.
type edit struct {
	at   int
	raw  string
	part string
}

// splice returns body with edits, which are in the body's order, made in one copy.
func splice(body []byte, edits []edit) ([]byte, error) {
	if len(edits) == 0 {
		return body, nil
	}
	size := len(body)
	for _, e := range edits {
		size += len(e.part) - len(e.raw)
	}
	out := make([]byte, 0, size)
	last := 0
	for _, e := range edits {
		end := e.at + len(e.raw)
		if e.at < last || end > len(body) || string(body[e.at:end]) != e.raw {
			return nil, fmt.Errorf("rewriting an input part: offset %d does not hold the part", e.at)
		}
		out = append(out, body[last:e.at]...)
		out = append(out, e.part...)
		last = end
	}
	return append(out, body[last:]...), nil
}
