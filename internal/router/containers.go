package router

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/jsondepth"
	"github.com/ciproxy/ciproxy/internal/listquery"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/store"
)

// The Containers API (/v1/containers) is served by the proxy over its own containers, the ones
// the code_interpreter tool runs in: a container made here is usable as the tool's
// container: "cntr_...", and one the tool made is listed here. Every container belongs to the
// caller that made it; for anyone else it does not exist.

const (
	// Container and container file list limits, as OpenAI's.
	defaultContainerListLimit = 20
	maxContainerListLimit     = 100
	// maxContainerName bounds a container's name.
	maxContainerName = 256
	// expires_after.minutes bounds: a minute to a day (a container lives a day at most, unless its
	// idle timeout is longer).
	minContainerMinutes = 1
	maxContainerMinutes = 24 * 60
	// jsonFileBodyLimit bounds the JSON body of POST /v1/containers/{id}/files ({"file_id"}).
	jsonFileBodyLimit = 64 << 10
)

var memoryLimits = []string{"1g", "4g", "16g", "64g"}

// containerObject is OpenAI's container object.
type containerObject struct {
	ID           string       `json:"id"`
	Object       string       `json:"object"`
	CreatedAt    int64        `json:"created_at"`
	Status       string       `json:"status"`
	ExpiresAfter expiresAfter `json:"expires_after"`
	LastActiveAt int64        `json:"last_active_at"`
	MemoryLimit  string       `json:"memory_limit"`
	Name         string       `json:"name"`
	// NetworkPolicy is shown when one was set, never with its secrets.
	NetworkPolicy *store.NetworkPolicy `json:"network_policy,omitempty"`
}

type expiresAfter struct {
	Anchor  string `json:"anchor"`
	Minutes int64  `json:"minutes"`
}

func toContainerObject(c containers.Info) containerObject {
	mem := c.MemoryLimit
	if mem == "" {
		mem = "1g" // OpenAI's default, which the tool's default stands for
	}
	return containerObject{ID: c.ID, Object: "container", CreatedAt: c.CreatedAt.Unix(), Status: c.Status,
		ExpiresAfter: expiresAfter{Anchor: "last_active_at", Minutes: int64(c.IdleTimeout / time.Minute)},
		LastActiveAt: c.LastActiveAt.Unix(), MemoryLimit: mem, Name: c.Name, NetworkPolicy: c.Network}
}

// containerFileObject is OpenAI's container file object.
type containerFileObject struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	CreatedAt   int64  `json:"created_at"`
	Bytes       int64  `json:"bytes"`
	ContainerID string `json:"container_id"`
	Path        string `json:"path"`
	Source      string `json:"source"`
}

func toContainerFileObject(f store.ContainerFile) containerFileObject {
	return containerFileObject{ID: f.ID, Object: "container.file", CreatedAt: f.CreatedAt.Unix(), Bytes: f.Bytes,
		ContainerID: f.ContainerID, Path: f.Path, Source: f.Source}
}

// objectList is OpenAI's list shape.
type objectList[T any] struct {
	Object  string  `json:"object"`
	Data    []T     `json:"data"`
	FirstID *string `json:"first_id"`
	LastID  *string `json:"last_id"`
	HasMore bool    `json:"has_more"`
}

func newList[T any](data []T, hasMore bool, id func(T) string) objectList[T] {
	l := objectList[T]{Object: "list", Data: data, HasMore: hasMore}
	if n := len(data); n > 0 {
		first, last := id(data[0]), id(data[n-1])
		l.FirstID, l.LastID = &first, &last
	}
	return l
}

// deletedObject answers a DELETE.
type deletedObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Deleted bool   `json:"deleted"`
}

// containerLimits are the request's configuration's limits on a container's files: a file as
// large as the Files API takes, all of them as much as one key may store, and a fixed count.
func containerLimits(cfg *config.Config) containers.ContainerLimits {
	return containers.ContainerLimits{FileBytes: fileLimits(cfg).MaxBytes, TotalBytes: cfg.General.MaxFileStoragePerKey,
		Files: containers.DefaultMaxContainerFiles}
}

func noSuchContainer(id string) *apierror.Error {
	return apierror.NotFound("Container with id '"+id+"' not found.", "container_id")
}

// containerError turns what containers.Manager refused into the client's error; param names the
// parameter that carried the file when a file was refused ("file" for an upload, "file_id",
// "file_ids").
func containerError(err error, id, fileID, param string) error {
	var fe *containers.FileError
	if errors.As(err, &fe) {
		param = fmt.Sprintf("%s[%d]", param, fe.Index)
		fileID = fe.FileID
	}
	var elsewhere *containers.ElsewhereError
	switch {
	case errors.As(err, &elsewhere):
		return &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeServer,
			Message: "The container is served by another replica of this proxy; try again.", Err: err}
	case fe != nil && errors.Is(err, sandbox.ErrNotFound) && !errors.Is(err, containers.ErrExpired):
		return apierror.NotFound("No such File object: "+fileID, param)
	case errors.Is(err, containers.ErrExpired):
		return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Param: "container_id", Code: apierror.CodeContainerExpired,
			Message: "Container with id '" + id + "' has expired and can no longer be used.", Err: err}
	case errors.Is(err, containers.ErrNoSuchFile):
		return apierror.NotFound("Container file with id '"+fileID+"' not found.", "file_id")
	case errors.Is(err, sandbox.ErrNotFound):
		return noSuchContainer(id)
	case errors.Is(err, containers.ErrInvalidFilename):
		return apierror.BadRequest("Invalid '"+param+"': "+strings.TrimPrefix(err.Error(), containers.ErrInvalidFilename.Error()+": ")+".", param, apierror.CodeInvalidFilename)
	case errors.Is(err, sandbox.ErrNameTaken):
		return &apierror.Error{Status: http.StatusConflict, Type: apierror.TypeInvalidRequest, Param: param, Code: apierror.CodeNameTaken,
			Message: "Code in the container holds that name and the names after it; choose another filename.", Err: err}
	case errors.Is(err, sandbox.ErrFileBusy):
		return &apierror.Error{Status: http.StatusConflict, Type: apierror.TypeInvalidRequest, Param: param, Code: apierror.CodeFileBusy,
			Message: "The file is held busy by code running in the container; try again later.", Err: err}
	case errors.Is(err, sandbox.ErrFileTooLarge):
		return &apierror.Error{Status: http.StatusRequestEntityTooLarge, Type: apierror.TypeInvalidRequest, Param: param, Code: apierror.CodeFileTooLarge,
			Message: "The file is larger than the limit for one file.", Err: err}
	case errors.Is(err, sandbox.ErrContainerFull):
		return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Param: param, Code: apierror.CodeStorageLimitExceeded,
			Message: "The container's files would take more than its storage limit.", Err: err}
	case errors.Is(err, containers.ErrTooManyFiles):
		return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Param: param, Code: apierror.CodeTooManyFiles,
			Message: fmt.Sprintf("The container would hold more than %d files.", containers.DefaultMaxContainerFiles), Err: err}
	case errors.Is(err, store.ErrUnavailable):
		return &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeServer, Message: "The container registry is unavailable; try again later.", Err: err}
	case errors.Is(err, sandbox.ErrUnavailable), errors.Is(err, sandbox.ErrTimeout), errors.Is(err, sandbox.ErrRateLimited):
		return apierror.BadGateway("The code interpreter sandbox is unavailable.", apierror.CodeSandboxUnavailable, err)
	}
	return err
}

// jsonObject checks that body is a JSON object the proxy may parse (depth first, see jsondepth).
func jsonObject(body []byte) (gjson.Result, error) {
	if !jsondepth.Within(body, jsondepth.Max) {
		return gjson.Result{}, apierror.BadRequest(fmt.Sprintf("The JSON body of your request nests deeper than %d levels of arrays and objects.", jsondepth.Max), "", "")
	}
	if !gjson.ValidBytes(body) || !gjson.ParseBytes(body).IsObject() {
		return gjson.Result{}, apierror.BadRequest("We could not parse the JSON body of your request. The API expects a JSON object.", "", "")
	}
	return gjson.ParseBytes(body), nil
}

// newContainer is a validated POST /v1/containers body.
type newContainer struct {
	name    string
	fileIDs []string
	minutes int64 // 0: not given
	memory  string
	network *egress.Policy // nil: none set
}

func parseNewContainer(body []byte) (newContainer, error) {
	obj, err := jsonObject(body)
	if err != nil {
		return newContainer{}, err
	}
	var nc newContainer
	switch name := obj.Get("name"); {
	case !name.Exists() || name.Type == gjson.Null:
		return nc, apierror.BadRequest("Missing required parameter: 'name'.", "name", "")
	case name.Type != gjson.String:
		return nc, apierror.InvalidType("name", "a string", name)
	case len(name.Str) > maxContainerName:
		return nc, apierror.BadRequest(fmt.Sprintf("Invalid 'name': string too long. Expected a string with maximum length %d, but got a string with length %d instead.", maxContainerName, len(name.Str)), "name", apierror.CodeStringAboveMaxLength)
	default:
		nc.name = name.Str
	}
	if ids := obj.Get("file_ids"); ids.Exists() && ids.Type != gjson.Null {
		if !ids.IsArray() {
			return nc, apierror.InvalidType("file_ids", "an array", ids)
		}
		arr := ids.Array()
		if len(arr) > containers.DefaultMaxContainerFiles {
			return nc, apierror.BadRequest(fmt.Sprintf("Invalid 'file_ids': array too long. Expected an array with maximum length %d, but got an array with length %d instead.", containers.DefaultMaxContainerFiles, len(arr)), "file_ids", apierror.CodeArrayAboveMaxLength)
		}
		for i, id := range arr {
			if id.Type != gjson.String {
				return nc, apierror.InvalidType(fmt.Sprintf("file_ids[%d]", i), "a string", id)
			}
			nc.fileIDs = append(nc.fileIDs, id.Str)
		}
	}
	if ea := obj.Get("expires_after"); ea.Exists() && ea.Type != gjson.Null {
		if !ea.IsObject() {
			return nc, apierror.InvalidType("expires_after", "an object", ea)
		}
		switch anchor := ea.Get("anchor"); {
		case !anchor.Exists():
			return nc, apierror.BadRequest("Missing required parameter: 'expires_after.anchor'.", "expires_after.anchor", "")
		case anchor.Type != gjson.String || anchor.Str != "last_active_at":
			return nc, apierror.BadRequest(fmt.Sprintf("Invalid value for 'expires_after.anchor': %s. Supported values are: 'last_active_at'.", anchor.Raw), "expires_after.anchor", apierror.CodeInvalidValue)
		}
		minutes := ea.Get("minutes")
		switch {
		case !minutes.Exists():
			return nc, apierror.BadRequest("Missing required parameter: 'expires_after.minutes'.", "expires_after.minutes", "")
		case apierror.JSONType(minutes) != "an integer":
			return nc, apierror.InvalidType("expires_after.minutes", "an integer", minutes)
		case minutes.Int() < minContainerMinutes:
			return nc, apierror.BadRequest(fmt.Sprintf("Invalid 'expires_after.minutes': integer below minimum value. Expected a value >= %d, but got %s instead.", minContainerMinutes, minutes.Raw), "expires_after.minutes", apierror.CodeIntegerBelowMinValue)
		case minutes.Int() > maxContainerMinutes:
			return nc, apierror.BadRequest(fmt.Sprintf("Invalid 'expires_after.minutes': integer above maximum value. Expected a value <= %d, but got %s instead.", maxContainerMinutes, minutes.Raw), "expires_after.minutes", apierror.CodeIntegerAboveMaxValue)
		}
		nc.minutes = minutes.Int()
	}
	if mem := obj.Get("memory_limit"); mem.Exists() && mem.Type != gjson.Null {
		if mem.Type != gjson.String || !contains(memoryLimits, mem.Str) {
			return nc, apierror.BadRequest(fmt.Sprintf("Invalid value for 'memory_limit': %s. Supported values are: %s.", mem.Raw, quoteList(memoryLimits)), "memory_limit", apierror.CodeInvalidValue)
		}
		nc.memory = mem.Str
	}
	np, bad := intercept.ParseNetworkPolicy(obj.Get("network_policy"), "network_policy")
	if bad != nil {
		return nc, bad
	}
	nc.network = np
	if sk := obj.Get("skills"); sk.Exists() && sk.Type != gjson.Null && !(sk.IsArray() && len(sk.Array()) == 0) {
		return nc, apierror.BadRequest("'skills' are not supported by this proxy.", "skills", apierror.CodeUnsupportedValue)
	}
	return nc, nil
}

func contains(vs []string, v string) bool {
	for _, x := range vs {
		if x == v {
			return true
		}
	}
	return false
}

// createContainer serves POST /v1/containers: a sandbox on the interception's sandbox tool, with
// the Files API files file_ids copied into /mnt/data. Every file is checked before the sandbox is
// created, and a failure after it deletes the sandbox: nothing is half-made.
func (s *server) createContainer(w http.ResponseWriter, r *http.Request) error {
	cfg := configFrom(r.Context())
	if cfg == nil {
		return notReady()
	}
	body, err := readBody(w, r, s.bodyTimeout)
	if err != nil {
		return err
	}
	nc, err := parseNewContainer(body)
	if err != nil {
		return err
	}
	ctx, owner, lim := r.Context(), Caller(r.Context()), containerLimits(cfg)
	if _, err := s.containers.StatFiles(ctx, owner, nc.fileIDs, lim); err != nil {
		return containerError(err, "", "", "file_ids")
	}
	idle := time.Duration(nc.minutes) * time.Minute
	if idle == 0 {
		idle = cfg.Interception.ContainerIdleTimeout
	}
	if idle <= 0 {
		idle = containers.DefaultIdleTimeout // a container made to be used later outlives its request
	}
	c, err := s.containers.Create(ctx, cfg.Interception.SandboxToolName, owner, sandbox.CreateOptions{Name: nc.name, MemoryLimit: nc.memory, NetworkPolicy: nc.network, KernelIdle: cfg.Interception.KernelIdleTimeout}, idle)
	if bad := intercept.NetworkRefusal(err, "network_policy"); bad != nil {
		return bad
	}
	if err != nil {
		return quotaError(containerError(err, "", "", ""))
	}
	if _, err := c.PlaceFiles(ctx, nc.fileIDs, lim); err != nil {
		s.containers.Discard(ctx, c)
		return containerError(err, c.ID(), "", "file_ids")
	}
	info := c.Info()
	s.containers.Release(ctx, c)
	writeJSON(w, http.StatusOK, toContainerObject(info))
	return nil
}

// listPage reads limit, order and after (an id of kind) as OpenAI's list endpoints take them.
func listPage(r *http.Request, kind store.Kind) (store.Page, error) {
	q := r.URL.Query()
	var p store.Page
	var err error
	if p.Limit, err = listquery.Limit(q, defaultContainerListLimit, maxContainerListLimit); err != nil {
		return p, err
	}
	order, err := listquery.Order(q)
	if err != nil {
		return p, err
	}
	p.Order = store.Order(order)
	if v := q.Get("after"); v != "" {
		if !kind.Valid(v) {
			return p, apierror.BadRequest(fmt.Sprintf("Invalid 'after': '%s' is not an id of this list.", v), "after", apierror.CodeInvalidValue)
		}
		p.After = v
	}
	return p, nil
}

// listContainers serves GET /v1/containers: the caller's containers, newest first unless
// order=asc, expired ones included.
func (s *server) listContainers(w http.ResponseWriter, r *http.Request) error {
	page, err := listPage(r, store.ContainerKind)
	if err != nil {
		return err
	}
	l, err := s.containers.List(r.Context(), Caller(r.Context()), store.ContainerQuery{Name: r.URL.Query().Get("name"), Page: page})
	if err != nil {
		return containerError(err, "", "", "")
	}
	data := make([]containerObject, len(l.Items))
	for i, c := range l.Items {
		data[i] = toContainerObject(c)
	}
	writeJSON(w, http.StatusOK, newList(data, l.HasMore, func(c containerObject) string { return c.ID }))
	return nil
}

// getContainer serves GET /v1/containers/{id}.
func (s *server) getContainer(w http.ResponseWriter, r *http.Request) error {
	id := chi.URLParam(r, "id")
	c, err := s.containers.Get(r.Context(), Caller(r.Context()), id)
	if err != nil {
		return containerError(err, id, "", "")
	}
	writeJSON(w, http.StatusOK, toContainerObject(c))
	return nil
}

// deleteContainer serves DELETE /v1/containers/{id}: the sandbox goes, and the container with it.
func (s *server) deleteContainer(w http.ResponseWriter, r *http.Request) error {
	id := chi.URLParam(r, "id")
	if err := s.containers.Delete(r.Context(), Caller(r.Context()), id); err != nil {
		return containerError(err, id, "", "")
	}
	writeJSON(w, http.StatusOK, deletedObject{ID: id, Object: "container.deleted", Deleted: true})
	return nil
}

// createContainerFile serves POST /v1/containers/{id}/files: a multipart form with the file
// (streamed into the sandbox as it arrives) or a file_id field, or a JSON body {"file_id"}. The
// file lands in /mnt/data under its own name (disambiguated) with source "user". A refused or
// failed upload leaves nothing.
func (s *server) createContainerFile(w http.ResponseWriter, r *http.Request) error {
	cfg := configFrom(r.Context())
	if cfg == nil {
		return notReady()
	}
	id := chi.URLParam(r, "id")
	lim := containerLimits(cfg)
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case err == nil && mt == "application/json":
		r.Body = http.MaxBytesReader(w, r.Body, jsonFileBodyLimit)
		body, err := readBody(w, r, s.bodyTimeout)
		if err != nil {
			return err
		}
		obj, err := jsonObject(body)
		if err != nil {
			return err
		}
		switch fid := obj.Get("file_id"); {
		case !fid.Exists() || fid.Type == gjson.Null:
			return apierror.BadRequest("Missing required parameter: 'file_id' (or upload a 'file' as multipart/form-data).", "file_id", "")
		case fid.Type != gjson.String:
			return apierror.InvalidType("file_id", "a string", fid)
		default:
			return s.placeStoredFile(w, r, id, fid.Str, lim)
		}
	case err == nil && mt == "multipart/form-data" && params["boundary"] != "":
	default:
		return apierror.BadRequest("The request body must be multipart/form-data with a 'file' (or a 'file_id'), or JSON with a 'file_id'.", "", "")
	}

	bodyMax := lim.FileBytes + multipartSlack
	if r.ContentLength > bodyMax {
		w.Header().Set("Connection", "close")
		return containerError(sandbox.ErrFileTooLarge, id, "", "file")
	}
	body := s.uploadBody(w, r, bodyMax, cfg)
	up := &containerUpload{s: s, r: r, id: id, lim: lim}
	defer up.release()
	if err := readForm(multipart.NewReader(body, params["boundary"]), up); err != nil {
		w.Header().Set("Connection", "close")
		up.undo()
		return uploadError(err, body, r, cfg)
	}
	body.done()
	switch {
	case up.stored != nil && up.fileID != nil:
		// Both were sent: the upload is undone, as neither can be told to win.
		up.undo()
		return apierror.BadRequest("Send either a 'file' or a 'file_id', not both.", "file_id", "")
	case up.stored != nil:
		writeJSON(w, http.StatusOK, toContainerFileObject(*up.stored))
		return nil
	case up.fileID != nil:
		up.release()
		return s.placeStoredFile(w, r, id, *up.fileID, lim)
	}
	return apierror.BadRequest("Missing required parameter: 'file' (or 'file_id').", "file", "")
}

// placeStoredFile copies Files API file fileID into container id.
func (s *server) placeStoredFile(w http.ResponseWriter, r *http.Request, id, fileID string, lim containers.ContainerLimits) error {
	ctx, owner := r.Context(), Caller(r.Context())
	c, err := s.containers.Open(ctx, id, owner)
	if err != nil {
		return containerError(err, id, "", "")
	}
	defer s.containers.Release(ctx, c)
	files, err := c.PlaceFiles(ctx, []string{fileID}, lim)
	if err != nil {
		var fe *containers.FileError
		if errors.As(err, &fe) {
			err = fe.Err // one file: the parameter is file_id itself
		}
		if errors.Is(err, sandbox.ErrNotFound) && !errors.Is(err, containers.ErrExpired) {
			return apierror.NotFound("No such File object: "+fileID, "file_id")
		}
		return containerError(err, id, fileID, "file_id")
	}
	writeJSON(w, http.StatusOK, toContainerFileObject(files[0]))
	return nil
}

// containerUpload collects the parts of one multipart container file upload.
type containerUpload struct {
	s   *server
	r   *http.Request
	id  string
	lim containers.ContainerLimits

	c      *containers.Container
	stored *store.ContainerFile
	fileID *string
}

// undo deletes the file the form stored, when what followed it refused the form.
func (u *containerUpload) undo() {
	if u.stored != nil {
		ctx := context.WithoutCancel(u.r.Context())
		if err := u.s.containers.DeleteFile(ctx, Caller(ctx), u.id, u.stored.ID); err != nil {
			u.s.log.Warn("undoing a refused container file upload", zap.String("container", u.id), zap.Error(err))
		}
		u.stored = nil
	}
}

func (u *containerUpload) release() {
	if u.c != nil {
		u.s.containers.Release(u.r.Context(), u.c)
		u.c = nil
	}
}

// field implements uploadParts.
func (u *containerUpload) field(name string) func(string) error {
	if name == "file_id" {
		return keep(&u.fileID)
	}
	return nil
}

// file streams the file part into the container.
func (u *containerUpload) file(part *multipart.Part) error {
	if u.stored != nil {
		return apierror.BadRequest("Only one file may be uploaded per request.", "file", "")
	}
	if u.fileID != nil {
		return apierror.BadRequest("Send either a 'file' or a 'file_id', not both.", "file_id", "")
	}
	ctx, owner := u.r.Context(), Caller(u.r.Context())
	if u.c == nil {
		c, err := u.s.containers.Open(ctx, u.id, owner)
		if err != nil {
			return containerError(err, u.id, "", "")
		}
		u.c = c
	}
	src := &readRecorder{r: part}
	f, err := u.c.AddFile(ctx, rawFilename(part), "", src, u.lim)
	if err != nil {
		if src.err != nil {
			return readError{src.err}
		}
		return containerError(err, u.id, "", "file")
	}
	u.stored = &f
	return nil
}

// listContainerFiles serves GET /v1/containers/{id}/files.
func (s *server) listContainerFiles(w http.ResponseWriter, r *http.Request) error {
	id := chi.URLParam(r, "id")
	page, err := listPage(r, store.ContainerFileKind)
	if err != nil {
		return err
	}
	l, err := s.containers.Files(r.Context(), Caller(r.Context()), id, store.ContainerFileQuery{Page: page})
	if err != nil {
		return containerError(err, id, "", "")
	}
	data := make([]containerFileObject, len(l.Items))
	for i, f := range l.Items {
		data[i] = toContainerFileObject(f)
	}
	writeJSON(w, http.StatusOK, newList(data, l.HasMore, func(f containerFileObject) string { return f.ID }))
	return nil
}

// getContainerFile serves GET /v1/containers/{id}/files/{file_id}.
func (s *server) getContainerFile(w http.ResponseWriter, r *http.Request) error {
	id, fid := chi.URLParam(r, "id"), chi.URLParam(r, "file_id")
	f, err := s.containers.File(r.Context(), Caller(r.Context()), id, fid)
	if err != nil {
		return containerError(err, id, fid, "")
	}
	writeJSON(w, http.StatusOK, toContainerFileObject(f))
	return nil
}

// containerFileContent serves GET /v1/containers/{id}/files/{file_id}/content: the bytes the
// sandbox holds now, read without following anything its code made (a link, a special file).
// The status is sent with the first byte, so that a file found gone is still a clean 404.
func (s *server) containerFileContent(w http.ResponseWriter, r *http.Request) error {
	cfg := configFrom(r.Context())
	if cfg == nil {
		return notReady()
	}
	id, fid := chi.URLParam(r, "id"), chi.URLParam(r, "file_id")
	ctx, owner := r.Context(), Caller(r.Context())
	f, err := s.containers.File(ctx, owner, id, fid)
	if err != nil {
		return containerError(err, id, fid, "")
	}
	lw := &lazyBody{w: w, name: path.Base(f.Path)}
	if _, _, err := s.containers.ReadFile(ctx, owner, id, fid, lw, containerLimits(cfg).FileBytes); err != nil {
		if lw.started {
			return fmt.Errorf("sending container file %s: %w", fid, err) // only the log can tell
		}
		return containerError(err, id, fid, "")
	}
	if !lw.started {
		lw.header(0)
	}
	return nil
}

// lazyBody sends the download's headers with its first byte, once the file is known to be there.
type lazyBody struct {
	w       http.ResponseWriter
	name    string
	started bool
}

func (b *lazyBody) header(length int64) {
	h := b.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	if length >= 0 {
		h.Set("Content-Length", strconv.FormatInt(length, 10))
	}
	disposition := "attachment"
	if b.name != "" {
		if d := mime.FormatMediaType("attachment", map[string]string{"filename": b.name}); d != "" {
			disposition = d
		}
	}
	h.Set("Content-Disposition", disposition)
	h.Set("X-Content-Type-Options", "nosniff")
	b.w.WriteHeader(http.StatusOK)
	b.started = true
}

func (b *lazyBody) Write(p []byte) (int, error) {
	if !b.started {
		b.header(-1)
	}
	return b.w.Write(p)
}

// deleteContainerFile serves DELETE /v1/containers/{id}/files/{file_id}: from the sandbox too.
func (s *server) deleteContainerFile(w http.ResponseWriter, r *http.Request) error {
	id, fid := chi.URLParam(r, "id"), chi.URLParam(r, "file_id")
	if err := s.containers.DeleteFile(r.Context(), Caller(r.Context()), id, fid); err != nil {
		return containerError(err, id, fid, "")
	}
	writeJSON(w, http.StatusOK, deletedObject{ID: fid, Object: "container.file.deleted", Deleted: true})
	return nil
}
