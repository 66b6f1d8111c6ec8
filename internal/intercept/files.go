package intercept

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/filename"
	"github.com/ciproxy/ciproxy/internal/inputfiles"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

// This file is the way files go into a request's container: the tool's container.file_ids, the
// input_file parts of the input's messages and of function_call_output items (by this proxy's
// file_id, or inline file_data) and its input_image parts by file_id, found when the request is
// parsed, checked against the caller's Files API files before anything runs, and placed in
// /mnt/data before the first upstream call, so the model is told their real paths. What goes
// upstream never names a file id: the stand-in function's description lists the tool's files,
// each input_file part becomes a text part naming its path, and each input_image by file_id
// becomes the same image as a data URL, followed by a text part naming its path when it was
// placed too (docs/files.md).

// MaxFileIDs is the most file ids container.file_ids may hold, as OpenAI's.
const MaxFileIDs = 50

// maxPlacedFiles bounds the files one request places: the tool's file ids and the input's files.
const maxPlacedFiles = 2 * MaxFileIDs

// FileStore is what the engine needs of the Files API's store: the caller's files by id, and
// their bytes. The embedded store implements it. Images by file_id are read into the upstream
// request by inputfiles, under its limits.
type FileStore = inputfiles.Store

// inputPart is where a content part sits in the client's input.
type inputPart struct {
	param string // where the request names the file, for errors
	item  int    // the client's input item holding it; -1: container.file_ids
	field string // the item's parts: "content" (a message) or "output" (a function_call_output)
	part  int    // the part's index in field
	at    int    // where that item is in parsedRequest.input (resolve sets it)
}

// path is the part's path in its item, for sjson.
func (p inputPart) path() string { return p.field + "." + strconv.Itoa(p.part) }

// wantedFile is one file the request puts into its container.
type wantedFile struct {
	containers.Placement
	inputPart
	image bool // an input_image part: it stays an image upstream, and a note follows it
}

// wantedInline is a part by file_id that goes upstream carrying the file: an input_image part,
// whose image_url becomes a data URL, or an input_file part of a request without
// code_interpreter, whose file_data does.
type wantedInline struct {
	inputPart
	fileID string
	file   bool // an input_file part
}

// parseFileIDs reads the auto container's file_ids (param names it, for errors).
func parseFileIDs(ids gjson.Result, param string) ([]wantedFile, *apierror.Error) {
	switch {
	case !ids.Exists(), ids.Type == gjson.Null:
		return nil, nil
	case !ids.IsArray():
		return nil, apierror.BadRequest("Invalid type for '"+param+"': expected an array of file ids.", param, apierror.CodeInvalidType)
	}
	arr := ids.Array()
	if len(arr) > MaxFileIDs {
		return nil, apierror.BadRequest(fmt.Sprintf("Invalid '%s': array too long. Expected an array with maximum length %d, but got an array with length %d instead.", param, MaxFileIDs, len(arr)), param, apierror.CodeArrayAboveMaxLength)
	}
	var out []wantedFile
	seen := map[string]bool{}
	for j, id := range arr {
		if id.Type != gjson.String || id.String() == "" {
			p := param + "[" + strconv.Itoa(j) + "]"
			return nil, apierror.BadRequest("Invalid type for '"+p+"': expected a file id.", p, apierror.CodeInvalidType)
		}
		if seen[id.String()] {
			continue
		}
		seen[id.String()] = true
		out = append(out, wantedFile{Placement: containers.Placement{FileID: id.String()}, inputPart: inputPart{param: param, item: -1}})
	}
	return out, nil
}

// parseInputFiles finds the parts of the input that name files, in its messages' content and in
// the output lists of its function_call_output items: the input_image parts by file_id, which go
// upstream as data URLs, and the input_file parts that carry a file (a file_id, or file_data with
// its filename). With code (the request has the code_interpreter tool) those files go to the
// container, as do those images; without it, an input_file by file_id goes upstream as inline
// file_data. Parts by file_url or image_url are left alone.
func parseInputFiles(input gjson.Result, code bool) ([]wantedFile, []wantedInline, *apierror.Error) {
	var files []wantedFile
	var inlined []wantedInline
	images := 0
	var bad *apierror.Error
	inputfiles.ForEachPart(input, func(ip inputfiles.Part) bool {
		p, pp := ip.Value, ip.Param()
		at := inputPart{param: pp, item: ip.Item, field: ip.Field, part: ip.Index, at: -1}
		switch p.Get("type").String() {
		case "input_image":
			id := p.Get("file_id")
			if id.Type != gjson.String || id.String() == "" {
				return true
			}
			at.param = pp + ".file_id"
			inlined = append(inlined, wantedInline{inputPart: at, fileID: id.String()})
			images++
			if code {
				files = append(files, wantedFile{Placement: containers.Placement{FileID: id.String()}, inputPart: at, image: true})
			}
		case "input_file":
			if !code {
				if id := p.Get("file_id"); id.Type == gjson.String && id.String() != "" {
					at.param = pp + ".file_id"
					inlined = append(inlined, wantedInline{inputPart: at, fileID: id.String(), file: true})
				}
				return true
			}
			var w wantedFile
			w, bad = inputFile(p, at)
			if bad != nil {
				return false
			}
			if w.FileID != "" || w.Name != "" {
				files = append(files, w)
			}
		}
		return true
	})
	if bad == nil && images > inputfiles.MaxInputImages {
		bad = apierror.BadRequest(fmt.Sprintf("Too many images by file_id: %d, at most %d per request.", images, inputfiles.MaxInputImages), "input", "")
	}
	return files, inlined, bad
}

// inputFile reads an input_file part at pp: the file it carries, or none (a zero wantedFile)
// when it carries neither file_id nor file_data.
func inputFile(p gjson.Result, at inputPart) (wantedFile, *apierror.Error) {
	pp := at.param
	w := wantedFile{inputPart: at}
	switch id, data := p.Get("file_id"), p.Get("file_data"); {
	case id.Type == gjson.String && id.String() != "":
		w.FileID = id.String()
		w.param = pp + ".file_id"
	case data.Type == gjson.String:
		var bad *apierror.Error
		if w.Data, bad = decodeFileData(data.String(), pp+".file_data"); bad != nil {
			return w, bad
		}
		fn := p.Get("filename")
		if fn.Type != gjson.String {
			return w, apierror.BadRequest("Missing required parameter: '"+pp+".filename'.", pp+".filename", apierror.CodeMissingRequiredParameter)
		}
		name, err := filename.Clean(fn.String())
		if err != nil {
			return w, apierror.BadRequest("Invalid '"+pp+".filename': "+err.Error()+".", pp+".filename", apierror.CodeInvalidFilename)
		}
		w.Name = name
	}
	return w, nil
}

// decodeFileData decodes an input_file's file_data: a data URL ("data:text/csv;base64,...") or
// bare base64.
func decodeFileData(s, param string) ([]byte, *apierror.Error) {
	if rest, ok := strings.CutPrefix(s, "data:"); ok {
		meta, payload, found := strings.Cut(rest, ",")
		if !found || !strings.HasSuffix(meta, ";base64") {
			return nil, apierror.BadRequest("Invalid '"+param+"': expected a base64 data URL (data:<type>;base64,...).", param, apierror.CodeInvalidValue)
		}
		s = payload
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, apierror.BadRequest("Invalid '"+param+"': the file data is not valid base64.", param, apierror.CodeInvalidValue)
	}
	return b, nil
}

// findFiles completes the request's files from the caller's Files API files: their names, and a
// 404 naming the parameter for an id the caller has no file for; then it puts each input_image
// by file_id upstream as a data URL of its bytes, and each input_file part to inline as
// file_data, after admit (when not nil) has admitted the bytes they take; the returned func
// releases them. It runs before the container is touched and before anything goes upstream, so
// a wrong id runs no code.
func (r *parsedRequest) findFiles(ctx context.Context, files FileStore, caller string, admit func(int64) (func(), error)) (func(), error) {
	if err := r.findPlaced(ctx, files, caller); err != nil {
		return nil, err
	}
	release := func() {}
	if admit != nil && len(r.inlined) > 0 && files != nil {
		var err error
		if release, err = admit(r.inlineBytes(ctx, files, caller)); err != nil {
			return nil, err
		}
	}
	if err := r.readInlined(ctx, files, caller); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// inlineBytes is the most the request's inline parts can hold: their files' sizes, each kind at
// most what one request may carry of it. An id the caller has no file for counts nothing (it is
// the 404 once read).
func (r *parsedRequest) inlineBytes(ctx context.Context, files FileStore, caller string) int64 {
	var images, docs int64
	for _, in := range r.inlined {
		f, err := files.File(ctx, caller, in.fileID)
		switch {
		case err != nil:
		case in.file:
			docs += f.Bytes
		default:
			images += f.Bytes
		}
	}
	return min(images, inputfiles.MaxInputImageBytes) + min(docs, inputfiles.MaxInputFileBytes)
}

// findPlaced completes the files to place from the caller's Files API files: their names, and
// a 404 naming the parameter for an id the caller has no file for.
func (r *parsedRequest) findPlaced(ctx context.Context, files FileStore, caller string) error {
	for i := range r.files {
		w := &r.files[i]
		if w.FileID == "" {
			continue
		}
		var f store.File
		err := store.ErrNotFound
		if files != nil {
			f, err = files.File(ctx, caller, w.FileID)
		}
		if err != nil {
			return fileError(err, w.FileID, w.param)
		}
		w.Name = f.Filename
	}
	return nil
}

// readInlined reads the files of the parts to inline into the input, as data URLs.
func (r *parsedRequest) readInlined(ctx context.Context, files FileStore, caller string) error {
	imageBytes, fileBytes := int64(0), int64(0)
	for _, in := range r.inlined {
		var out []byte
		if in.file {
			url, f, n, err := inputfiles.FileDataURL(ctx, files, caller, in.fileID, in.param, inputfiles.MaxInputFileBytes-fileBytes)
			if err != nil {
				return err
			}
			fileBytes += n
			if in.at < 0 || in.at >= len(r.input) {
				continue
			}
			if out, err = inlineFile(r.input[in.at], in.path(), url, f.Filename); err != nil {
				return fmt.Errorf("inlining file %s: %w", in.fileID, err)
			}
		} else {
			url, n, err := inputfiles.ImageURL(ctx, files, caller, in.fileID, in.param, inputfiles.MaxInputImageBytes-imageBytes)
			if err != nil {
				return err
			}
			imageBytes += n
			if in.at < 0 || in.at >= len(r.input) {
				continue
			}
			out, err = sjson.SetBytes(r.input[in.at], in.path()+".image_url", url)
			if err == nil {
				out, err = sjson.DeleteBytes(out, in.path()+".file_id")
			}
			if err != nil {
				return fmt.Errorf("inlining image %s: %w", in.fileID, err)
			}
		}
		r.input[in.at] = out
	}
	return nil
}

// inlineFile returns item with its input_file part at path carrying the file as file_data (url)
// instead of its file_id, and named name unless the client named it.
func inlineFile(item []byte, path, url, name string) ([]byte, error) {
	out, err := sjson.DeleteBytes(item, path+".file_id")
	if err == nil && gjson.GetBytes(out, path+".filename").Type != gjson.String {
		out, err = sjson.SetBytes(out, path+".filename", name)
	}
	if err == nil {
		out, err = sjson.SetBytes(out, path+".file_data", url)
	}
	return out, err
}

// fileError is the error of a Files API lookup of id, named by param: a 404 for an id the caller
// has no file for.
func fileError(err error, id, param string) error { return inputfiles.FileError(err, id, param) }

// uniquePlacements returns the distinct files to place, and for each wanted file the index of
// its placement: a file id named twice (in the tool and in the input) is placed once.
func (r *parsedRequest) uniquePlacements() ([]containers.Placement, []int) {
	var out []containers.Placement
	at := make([]int, len(r.files))
	byID := map[string]int{}
	for i, w := range r.files {
		if w.FileID != "" {
			if j, ok := byID[w.FileID]; ok {
				at[i] = j
				continue
			}
			byID[w.FileID] = len(out)
		}
		at[i] = len(out)
		out = append(out, w.Placement)
	}
	return out, at
}

// placed completes the request with where its files are: the stand-in function's description
// lists the tool's files, each input_file part the upstream would have seen becomes a text part
// naming its path, and a text part naming its path follows each image placed. records[i] is the
// record of r.files[i]. It is the last change to the request; the loop makes it before the first
// upstream call.
func (r *parsedRequest) placed(records []store.ContainerFile) {
	var listed []store.ContainerFile
	var parts []int // the files of input parts
	for i, w := range r.files {
		if w.item < 0 {
			listed = append(listed, records[i])
		} else if w.at >= 0 && w.at < len(r.input) {
			parts = append(parts, i)
		}
	}
	// The last part first, so that a note inserted after an image moves no part still to edit.
	slices.SortFunc(parts, func(a, b int) int {
		return cmp.Or(cmp.Compare(r.files[b].at, r.files[a].at), cmp.Compare(r.files[b].part, r.files[a].part))
	})
	for _, i := range parts {
		w := r.files[i]
		note := marshal(inputText{Type: "input_text", Text: w.note(records[i], r.fn)})
		if w.image {
			r.input[w.at] = insertPart(r.input[w.at], w.field, w.part, note)
		} else if out, err := sjson.SetRawBytes(r.input[w.at], w.path(), note); err == nil {
			r.input[w.at] = out
		}
	}
	if len(listed) > 0 && r.standInIndex >= 0 {
		tool := standInToolWith(r.fn, r.network, toolFilesNote(listed))
		if out, err := sjson.SetRawBytes(r.base, "tools."+strconv.Itoa(r.standInIndex), tool); err == nil {
			r.base = out
		}
	}
}

// insertPart returns item with part inserted into its list field after the part at index after.
func insertPart(item []byte, field string, after int, part []byte) []byte {
	list := gjson.GetBytes(item, field)
	if !list.IsArray() {
		return item
	}
	out := make([]byte, 0, len(list.Raw)+len(part)+1)
	out = append(out, '[')
	j := 0
	list.ForEach(func(_, p gjson.Result) bool {
		out = appendElem(out, []byte(p.Raw))
		if j == after {
			out = appendElem(out, part)
		}
		j++
		return true
	})
	out = append(out, ']')
	res, err := sjson.SetRawBytes(item, field, out)
	if err != nil {
		return item
	}
	return res
}

// inputText is an input_text content part.
type inputText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// note is what the upstream reads of the file's placement f: in place of an input_file part, or
// after an image.
func (w wantedFile) note(f store.ContainerFile, fn string) string {
	switch {
	case w.image:
		return fmt.Sprintf("[The image above is also available to the %s tool at %s (%d bytes).]", fn, f.Path, f.Bytes)
	case w.field == "output":
		return fmt.Sprintf("[File in this function output, available to the %s tool at %s (%d bytes).]", fn, f.Path, f.Bytes)
	}
	return fmt.Sprintf("[File attached by the user, available to the %s tool at %s (%d bytes).]", fn, f.Path, f.Bytes)
}

// toolFilesNote is appended to the stand-in function's description: the files of the tool's
// container.file_ids.
func toolFilesNote(files []store.ContainerFile) string {
	var b strings.Builder
	b.WriteString(" The user's files are in /mnt/data:")
	for _, f := range files {
		fmt.Fprintf(&b, " %s (%d bytes);", f.Path, f.Bytes)
	}
	s := b.String()
	return s[:len(s)-1] + "."
}

// containerLimits are what a container's files may take under cfg: one file as large as an
// upload may be, all of them what one key's files may take, and sandbox's count.
func containerLimits(cfg *config.Config) containers.ContainerLimits {
	lim := containers.ContainerLimits{FileBytes: cfg.General.MaxFileUploadSize, TotalBytes: cfg.General.MaxFileStoragePerKey, Files: containers.DefaultMaxContainerFiles}
	if lim.FileBytes <= 0 {
		lim.FileBytes = config.DefaultMaxFileUploadSize
	}
	return lim
}

// placeFiles puts the request's files into its container, waiting for the container, and
// completes the request with their paths. A file the container cannot take is the client's
// error; anything else is the sandbox's.
func (r *run) placeFiles(ctx context.Context) error {
	if len(r.req.files) == 0 {
		return nil
	}
	box, err := r.cont.get(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.e.m.sandboxErr.WithLabelValues("create").Inc()
		return sandboxUnavailable(err)
	}
	todo, at := r.req.uniquePlacements()
	recs, err := box.Place(ctx, todo, r.lim)
	param := r.req.files[0].param
	var pe *containers.FileError
	if errors.As(err, &pe) {
		if i := slices.Index(at, pe.Index); i >= 0 {
			param = r.req.files[i].param
		}
		err = pe.Err
	}
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, sandbox.ErrFileTooLarge):
		return apierror.BadRequest("The file is larger than the limit for one file in a container.", param, apierror.CodeFileTooLarge)
	case errors.Is(err, sandbox.ErrContainerFull):
		return apierror.BadRequest("The container's files would take more than its storage limit.", param, apierror.CodeStorageLimitExceeded)
	case errors.Is(err, containers.ErrTooManyFiles):
		return apierror.BadRequest(fmt.Sprintf("The container would hold more than %d files.", r.lim.Files), param, apierror.CodeTooManyFiles)
	case errors.Is(err, containers.ErrInvalidFilename):
		return apierror.BadRequest("Invalid filename for '"+param+"'.", param, apierror.CodeInvalidFilename)
	case pe != nil && pe.Index >= 0 && pe.Index < len(todo) && todo[pe.Index].FileID != "" && errors.Is(err, sandbox.ErrNotFound) && !errors.Is(err, containers.ErrExpired):
		// Deleted since the request was checked.
		return apierror.NotFound("No such File object: "+todo[pe.Index].FileID, param)
	case err != nil:
		r.e.m.sandboxErr.WithLabelValues("files").Inc()
		return sandboxUnavailable(err)
	case len(recs) != len(todo):
		return sandboxUnavailable(fmt.Errorf("placing %d files returned %d records", len(todo), len(recs)))
	}
	byFile := make([]store.ContainerFile, len(r.req.files))
	for i := range r.req.files {
		byFile[i] = recs[at[i]]
	}
	r.req.placed(byFile)
	r.tr.setContainer(box.ID())
	r.tr.addFiles(recs, false)
	if r.cont.created {
		r.tr.setAllFiles(nil) // a new container holds only what this request placed and collects
	}
	return nil
}
