package router

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/filename"
	"github.com/ciproxy/ciproxy/internal/listquery"
	"github.com/ciproxy/ciproxy/internal/store"
)

// The Files API (/v1/files) is served by the proxy itself, whatever the upstream: these are the
// files its containers can use. Every file belongs to the caller that uploaded it (Caller); for
// anyone else it does not exist.

// uploadPurposes are the purposes a file may be uploaded with, in OpenAI's order; listPurposes
// adds the ones OpenAI gives files it makes itself, which a list may filter on.
var (
	uploadPurposes = []string{"assistants", "batch", "fine-tune", "vision", "user_data", "evals"}
	listPurposes   = append(slices.Clone(uploadPurposes), "assistants_output", "batch_output", "fine-tune-results")
)

const (
	// multipartSlack is what an upload's body may hold beyond the file: the other fields, the
	// part headers and boundaries.
	multipartSlack = 1 << 20
	// fieldLimit bounds one text field of the form (purpose, expires_after[...]).
	fieldLimit = 1 << 10
	// Files API list limits, as OpenAI's.
	defaultFileListLimit = 10000
	maxFileListLimit     = 10000
	// expires_after.seconds bounds, as OpenAI's (one hour to 30 days); batch files expire after 30
	// days unless told otherwise.
	minFileExpiry   = 3600
	maxFileExpiry   = 30 * 24 * 3600
	batchFileExpiry = 30 * 24 * time.Hour
)

// fileObject is OpenAI's file object.
type fileObject struct {
	Object        string  `json:"object"`
	ID            string  `json:"id"`
	Purpose       string  `json:"purpose"`
	Filename      string  `json:"filename"`
	Bytes         int64   `json:"bytes"`
	CreatedAt     int64   `json:"created_at"`
	ExpiresAt     *int64  `json:"expires_at"`
	Status        string  `json:"status"`
	StatusDetails *string `json:"status_details"`
}

func toFileObject(f store.File) fileObject {
	o := fileObject{Object: "file", ID: f.ID, Purpose: f.Purpose, Filename: f.Filename, Bytes: f.Bytes, CreatedAt: f.CreatedAt.Unix(), Status: "processed"}
	if !f.ExpiresAt.IsZero() {
		at := f.ExpiresAt.Unix()
		o.ExpiresAt = &at
	}
	return o
}

// fileList is OpenAI's list of files.
type fileList struct {
	Object  string       `json:"object"`
	Data    []fileObject `json:"data"`
	FirstID *string      `json:"first_id"`
	LastID  *string      `json:"last_id"`
	HasMore bool         `json:"has_more"`
}

// fileDeleted answers DELETE /v1/files/{id}.
type fileDeleted struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Deleted bool   `json:"deleted"`
}

func noSuchFile(id string) *apierror.Error {
	return apierror.NotFound("No such File object: "+id, "id")
}

// storeError turns what the store refused into the client's error; anything else becomes a 500
// (or a 503 when the store is out of reach) whose cause only the log sees. The limits of
// uploads in flight are quotas, 429 as the others; the storage quota is OpenAI's 400.
func storeError(err error, cfg *config.Config) error {
	lim := fileLimits(cfg)
	switch {
	case errors.Is(err, store.ErrTooLarge):
		return &apierror.Error{Status: http.StatusRequestEntityTooLarge, Type: apierror.TypeInvalidRequest, Param: "file", Code: apierror.CodeFileTooLarge,
			Message: fmt.Sprintf("The file is larger than the limit of %d bytes.", lim.MaxBytes), Err: err}
	case errors.Is(err, store.ErrQuota):
		return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Param: "file", Code: apierror.CodeStorageLimitExceeded,
			Message: fmt.Sprintf("Storing this file would take your files past the limit of %d bytes for this API key; delete files to make room.", lim.OwnerBytes), Err: err}
	case errors.Is(err, store.ErrTooManyUploads):
		return apierror.RateLimited(fmt.Sprintf(
			"Rate limit reached for concurrent file uploads per API key: limit %d in flight (max_concurrent_uploads_per_key). Please try again once one finishes.",
			lim.MaxUploads), 0)
	case errors.Is(err, store.ErrInFlightFull):
		return apierror.RateLimited(fmt.Sprintf(
			"Rate limit reached for file uploads: the uploads in flight hold the proxy's limit of %d bytes (max_upload_bytes_in_flight). Please try again shortly.",
			lim.MaxInFlight), 0)
	case errors.Is(err, store.ErrUnavailable):
		return &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeServer, Message: "The file store is unavailable; try again later.", Err: err}
	}
	return err
}

// fileLimits are the request's configuration's limits on an upload.
func fileLimits(cfg *config.Config) store.FileLimits {
	g := cfg.General
	lim := store.FileLimits{MaxBytes: g.MaxFileUploadSize, OwnerBytes: g.MaxFileStoragePerKey,
		MaxUploads: g.MaxConcurrentUploadsPerKey, MaxInFlight: g.MaxUploadBytesInFlight}
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = config.DefaultMaxFileUploadSize
	}
	return lim
}

// createFile serves POST /v1/files: a multipart form with the file and its purpose. The file is
// streamed into the store as it arrives (never held in memory) and becomes visible only once the
// whole form is read and valid; a refused, failed or cut upload leaves nothing behind.
func (s *server) createFile(w http.ResponseWriter, r *http.Request) error {
	cfg := configFrom(r.Context())
	if cfg == nil {
		return notReady()
	}
	lim := fileLimits(cfg)
	bodyMax := lim.MaxBytes + multipartSlack
	if r.ContentLength > bodyMax {
		w.Header().Set("Connection", "close")
		return storeError(store.ErrTooLarge, cfg)
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return apierror.BadRequest("The request body must be multipart/form-data with the fields 'file' and 'purpose'.", "", "")
	}
	body := s.uploadBody(w, r, bodyMax, cfg)
	form := &uploadForm{s: s, r: r, owner: Caller(r.Context()), lim: lim, cfg: cfg}
	defer form.abort()
	if err := readForm(multipart.NewReader(body, params["boundary"]), form); err != nil {
		// What remains of the body cannot be read usefully; do not let net/http try.
		w.Header().Set("Connection", "close")
		return uploadError(err, body, r, cfg)
	}
	body.done()
	f, err := form.commit()
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toFileObject(f))
	return nil
}

// errUploadTimeout: the upload's body was not over by upload_timeout.
var errUploadTimeout = errors.New("the upload took longer than upload_timeout")

// uploadBody sets a read deadline before every read, so a client may neither stall for longer
// than perRead nor, sending a byte now and then, make its upload last past end. It remembers the
// first error a read ended with (io.EOF aside), for uploadError.
type uploadBody struct {
	r       io.Reader
	rc      *http.ResponseController
	perRead time.Duration
	end     time.Time
	err     error
}

// uploadBody is r's body, of at most max bytes, under the upload's deadlines.
func (s *server) uploadBody(w http.ResponseWriter, r *http.Request, max int64, cfg *config.Config) *uploadBody {
	return &uploadBody{r: http.MaxBytesReader(w, r.Body, max), rc: http.NewResponseController(w), perRead: s.bodyTimeout,
		end: time.Now().Add(uploadTimeout(cfg))}
}

// uploadTimeout is general_settings.upload_timeout.
func uploadTimeout(cfg *config.Config) time.Duration {
	if t := cfg.General.UploadTimeout; t > 0 {
		return t
	}
	return config.DefaultUploadTimeout
}

func (b *uploadBody) Read(p []byte) (int, error) {
	// ErrNotSupported (a writer without deadlines) only loses the deadline.
	deadline := time.Now().Add(b.perRead)
	if deadline.After(b.end) {
		deadline = b.end
	}
	_ = b.rc.SetReadDeadline(deadline)
	n, err := b.r.Read(p)
	if errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(b.end) {
		err = fmt.Errorf("%w: %w", errUploadTimeout, err)
	}
	if err != nil && b.err == nil && !errors.Is(err, io.EOF) {
		b.err = err
	}
	return n, err
}

// done clears the deadline once the body has been read, so that the connection's next reads do
// not inherit it.
func (b *uploadBody) done() { _ = b.rc.SetReadDeadline(time.Time{}) }

// readError is a failure to read the client's body (as opposed to the store failing to write).
type readError struct{ err error }

func (e readError) Error() string { return "reading the upload: " + e.err.Error() }
func (e readError) Unwrap() error { return e.err }

// readRecorder remembers the error that ended its reads, so that a failed copy into the store can
// be told apart: the client's body broke, or the store did.
type readRecorder struct {
	r   io.Reader
	err error
}

func (rr *readRecorder) Read(p []byte) (int, error) {
	n, err := rr.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		rr.err = err
	}
	return n, err
}

// uploadError maps a failure while reading the form from body: the client's errors and the
// store's refusals become 4xx; a store that failed otherwise is a 500 (or 503) whose cause only
// the log sees.
//
// When a read of the body failed, that failure is the answer, whatever err the layers above made
// of it. They may not have seen it: bufio's ReadLine drops an error that comes with part of a
// line, so textproto reports a header line cut by the deadline as malformed; and net/http cancels
// the request's context as the read fails, so a store that checks the context before its next
// read reports context.Canceled. Either would otherwise pass for a client that left, and the
// client would get an empty 200 where the 408 of upload_timeout is due. err is kept in the
// message only, so that its context.Canceled does not make handle take the request for one whose
// client left.
func uploadError(err error, body *uploadBody, r *http.Request, cfg *config.Config) error {
	var rerr readError
	if body.err != nil && (!errors.As(err, &rerr) || !errors.Is(rerr.err, body.err)) {
		err = fmt.Errorf("%w (then: %v)", readError{body.err}, err)
	}
	var apiErr *apierror.Error
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &apiErr):
		return err
	case errors.As(err, &tooBig):
		return storeError(store.ErrTooLarge, cfg)
	case errors.As(err, &rerr):
		switch {
		case errors.Is(err, errUploadTimeout):
			// 408, as a stalled body: the client did not send its request in the time the proxy
			// waits for one, and a retry on a faster link may well succeed.
			return &apierror.Error{Status: http.StatusRequestTimeout, Type: apierror.TypeInvalidRequest, Err: err,
				Message: fmt.Sprintf("The upload took longer than the limit of %s for one upload; nothing was stored.", uploadTimeout(cfg))}
		case errors.Is(err, os.ErrDeadlineExceeded):
			return &apierror.Error{Status: http.StatusRequestTimeout, Message: "Timed out reading the request body.", Type: apierror.TypeInvalidRequest, Err: err}
		case r.Context().Err() != nil:
			return fmt.Errorf("%w: %w", r.Context().Err(), err) // the client left
		}
		return &apierror.Error{Status: http.StatusBadRequest, Message: "The multipart body is malformed or ended before its end.", Type: apierror.TypeInvalidRequest, Err: err}
	}
	return storeError(err, cfg)
}

// uploadForm collects one upload's fields.
type uploadForm struct {
	s     *server
	r     *http.Request
	owner string
	lim   store.FileLimits
	cfg   *config.Config

	up       store.FileUpload
	filename string
	purpose  *string
	anchor   *string
	seconds  *string
}

func (f *uploadForm) abort() {
	if f.up != nil {
		_ = f.up.Abort()
	}
}

// readForm reads the parts of an upload's form in order: the part named "file" goes to the
// form's file, the text fields it knows to their setters (at most fieldLimit bytes each), and the
// fields it does not know are read past, as OpenAI's SDKs may add some. A failure to read the
// body is a readError. It stops at the first error and leaves the part it refuses unread:
// NextPart would drain it, and after an error nothing calls NextPart, so a refused upload is not
// read to its end.
func readForm(mr *multipart.Reader, f uploadParts) error {
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return readError{err}
		}
		if part.FormName() == "file" {
			if err := f.file(part); err != nil {
				return err
			}
			continue
		}
		set := f.field(part.FormName())
		if set == nil {
			if _, err := io.Copy(io.Discard, part); err != nil {
				return readError{err}
			}
			continue
		}
		v, err := io.ReadAll(io.LimitReader(part, fieldLimit+1))
		if err != nil {
			return readError{err}
		}
		if len(v) > fieldLimit {
			name := paramName(part.FormName())
			return apierror.BadRequest(fmt.Sprintf("'%s' is too long.", name), name, "")
		}
		if err := set(string(v)); err != nil {
			return err
		}
	}
}

// uploadParts is what one kind of upload form does with its parts (readForm).
type uploadParts interface {
	// file takes the part named "file", streaming it where it goes.
	file(*multipart.Part) error
	// field returns what takes the text field name, nil for a field the form does not know.
	field(name string) func(value string) error
}

// keep is a field setter that keeps the value in *dst.
func keep(dst **string) func(string) error {
	return func(v string) error {
		*dst = &v
		return nil
	}
}

// field implements uploadParts. A purpose sent before the file is checked before the file is
// read.
func (f *uploadForm) field(name string) func(string) error {
	switch name {
	case "purpose":
		return func(v string) error {
			f.purpose = &v
			if f.up == nil {
				return checkPurpose(v)
			}
			return nil
		}
	case "expires_after[anchor]", "expires_after.anchor":
		return keep(&f.anchor)
	case "expires_after[seconds]", "expires_after.seconds":
		return keep(&f.seconds)
	}
	return nil
}

// paramName is a form field's name as OpenAI names parameters.
func paramName(field string) string {
	return strings.NewReplacer("[", ".", "]", "").Replace(field)
}

func (f *uploadForm) file(part *multipart.Part) error {
	if f.up != nil {
		return apierror.BadRequest("Only one file may be uploaded per request.", "file", "")
	}
	name, err := filename.Clean(rawFilename(part))
	if err != nil {
		return apierror.BadRequest("Invalid 'file': "+err.Error()+".", "file", apierror.CodeInvalidFilename)
	}
	f.filename = name
	up, err := f.s.files.BeginFile(f.r.Context(), f.owner, f.lim)
	if err != nil {
		return err
	}
	f.up = up
	src := &readRecorder{r: part}
	if _, err := up.Write(f.r.Context(), src); err != nil {
		if src.err != nil {
			return readError{src.err}
		}
		return err
	}
	return nil
}

// rawFilename is the filename parameter of the part's Content-Disposition as the client sent it.
// Part.FileName would hide what the client sent (it keeps only the last path element), and the
// name is judged by filename.Clean instead.
func rawFilename(part *multipart.Part) string {
	_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

func checkPurpose(p string) error {
	if p == "" {
		return apierror.BadRequest("Missing required parameter: 'purpose'.", "purpose", "")
	}
	if !slices.Contains(uploadPurposes, p) {
		return apierror.BadRequest(fmt.Sprintf("Invalid value for 'purpose': '%s'. Supported values are: %s.", p, quoteList(uploadPurposes)), "purpose", apierror.CodeInvalidValue)
	}
	return nil
}

func quoteList(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = "'" + v + "'"
	}
	return strings.Join(q[:len(q)-1], ", ") + " and " + q[len(q)-1]
}

// commit checks the fields that the file did not carry and stores the file.
func (f *uploadForm) commit() (store.File, error) {
	if f.up == nil {
		return store.File{}, apierror.BadRequest("Missing required parameter: 'file'.", "file", "")
	}
	if f.purpose == nil {
		return store.File{}, checkPurpose("")
	}
	if err := checkPurpose(*f.purpose); err != nil {
		return store.File{}, err
	}
	now := f.s.now()
	file := store.File{Filename: f.filename, Purpose: *f.purpose, CreatedAt: now}
	expiry, err := f.expiry()
	if err != nil {
		return store.File{}, err
	}
	switch {
	case expiry > 0:
		file.ExpiresAt = now.Add(expiry)
	case file.Purpose == "batch":
		file.ExpiresAt = now.Add(batchFileExpiry)
	}
	stored, err := f.up.Commit(f.r.Context(), file)
	if err != nil {
		return store.File{}, storeError(err, f.cfg)
	}
	return stored, nil
}

// expiry reads expires_after (anchor created_at, seconds between one hour and 30 days); 0 when
// it is absent.
func (f *uploadForm) expiry() (time.Duration, error) {
	if f.anchor == nil && f.seconds == nil {
		return 0, nil
	}
	if f.anchor == nil {
		return 0, apierror.BadRequest("Missing required parameter: 'expires_after.anchor'.", "expires_after.anchor", "")
	}
	if *f.anchor != "created_at" {
		return 0, apierror.BadRequest(fmt.Sprintf("Invalid value for 'expires_after.anchor': '%s'. Supported values are: 'created_at'.", *f.anchor), "expires_after.anchor", apierror.CodeInvalidValue)
	}
	if f.seconds == nil {
		return 0, apierror.BadRequest("Missing required parameter: 'expires_after.seconds'.", "expires_after.seconds", "")
	}
	n, err := strconv.ParseInt(strings.TrimSpace(*f.seconds), 10, 64)
	if err != nil || n < minFileExpiry || n > maxFileExpiry {
		return 0, apierror.BadRequest(fmt.Sprintf("Invalid 'expires_after.seconds': expected an integer between %d and %d, got '%s'.", minFileExpiry, maxFileExpiry, *f.seconds),
			"expires_after.seconds", apierror.CodeInvalidValue)
	}
	return time.Duration(n) * time.Second, nil
}

// listFiles serves GET /v1/files: the caller's files, newest first unless order=asc, in OpenAI's
// list shape.
func (s *server) listFiles(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	var fq store.FileQuery
	if p := q.Get("purpose"); q.Has("purpose") {
		if !slices.Contains(listPurposes, p) {
			return apierror.BadRequest(fmt.Sprintf("Invalid value for 'purpose': '%s'. Supported values are: %s.", p, quoteList(listPurposes)), "purpose", apierror.CodeInvalidValue)
		}
		fq.Purpose = p
	}
	var err error
	if fq.Limit, err = listquery.Limit(q, defaultFileListLimit, maxFileListLimit); err != nil {
		return err
	}
	order, err := listquery.Order(q)
	if err != nil {
		return err
	}
	fq.Order = store.Order(order)
	if v := q.Get("after"); v != "" {
		if !store.FileKind.Valid(v) {
			return apierror.BadRequest(fmt.Sprintf("Invalid 'after': '%s' is not a file id.", v), "after", apierror.CodeInvalidValue)
		}
		fq.After = v
	}
	l, err := s.files.ListFiles(r.Context(), Caller(r.Context()), fq)
	if err != nil {
		return storeError(err, configFrom(r.Context()))
	}
	out := fileList{Object: "list", Data: make([]fileObject, len(l.Items)), HasMore: l.HasMore}
	for i, f := range l.Items {
		out.Data[i] = toFileObject(f)
	}
	if n := len(out.Data); n > 0 {
		out.FirstID, out.LastID = &out.Data[0].ID, &out.Data[n-1].ID
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// getFile serves GET /v1/files/{id}.
func (s *server) getFile(w http.ResponseWriter, r *http.Request) error {
	id := chi.URLParam(r, "id")
	f, err := s.files.File(r.Context(), Caller(r.Context()), id)
	if errors.Is(err, store.ErrNotFound) {
		return noSuchFile(id)
	}
	if err != nil {
		return storeError(err, configFrom(r.Context()))
	}
	writeJSON(w, http.StatusOK, toFileObject(f))
	return nil
}

// fileContent serves GET /v1/files/{id}/content: the bytes as they were uploaded.
func (s *server) fileContent(w http.ResponseWriter, r *http.Request) error {
	id := chi.URLParam(r, "id")
	f, rc, err := s.files.OpenFile(r.Context(), Caller(r.Context()), id)
	if errors.Is(err, store.ErrNotFound) {
		return noSuchFile(id)
	}
	if err != nil {
		return storeError(err, configFrom(r.Context()))
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(f.Bytes, 10))
	disposition := mime.FormatMediaType("attachment", map[string]string{"filename": f.Filename})
	if disposition == "" {
		disposition = "attachment" // a name mime cannot encode is still not sent raw
	}
	h.Set("Content-Disposition", disposition)
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		// Headers are out: the only honest end is a cut connection, which the client sees as a
		// body shorter than Content-Length.
		return fmt.Errorf("sending file %s: %w", id, err)
	}
	return nil
}

// deleteFile serves DELETE /v1/files/{id}.
func (s *server) deleteFile(w http.ResponseWriter, r *http.Request) error {
	id := chi.URLParam(r, "id")
	_, err := s.files.DeleteFile(r.Context(), Caller(r.Context()), id)
	if errors.Is(err, store.ErrNotFound) {
		return noSuchFile(id)
	}
	if err != nil {
		return storeError(err, configFrom(r.Context()))
	}
	writeJSON(w, http.StatusOK, fileDeleted{ID: id, Object: "file", Deleted: true})
	return nil
}
