package agentsandboxtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/watch"
)

// historyLimit is how many events the store keeps for watch resumption; a watch from an older
// resource version gets 410 Gone, as from an API server whose etcd was compacted.
const historyLimit = 1000

// Request is one API request the double served.
type Request struct {
	Verb      string // get, list, watch, create, delete, patch, discovery
	Resource  string // e.g. "sandboxclaims"; empty for discovery
	Path      string
	Query     string // the raw query: labelSelector, fieldSelector, resourceVersion, …
	WithToken bool   // the request carried the kubeconfig's bearer token
	Code      int
}

// event is one change of one object, as a watch sends it.
type event struct {
	typ watch.EventType
	res *resource
	obj *unstructured.Unstructured // a deep copy, never modified
	rv  uint64
}

// watcher is one open watch.
type watcher struct {
	res       *resource
	ns        string
	match     func(*unstructured.Unstructured) bool
	ch        chan event
	done      chan struct{}
	closeOnce sync.Once
}

func (w *watcher) close() { w.closeOnce.Do(func() { close(w.done) }) }

// store holds the objects and their history. Its mutex (Server.mu) guards everything here.
type store struct {
	rv       uint64
	objects  map[string]map[string]*unstructured.Unstructured // resource -> ns/name -> object
	history  []event
	oldestRV uint64 // the oldest resource version a watch may resume from
	watchers map[*watcher]bool
}

func key(ns, name string) string { return ns + "/" + name }

// put stores obj (a create when it is new), bumping the resource version, and tells watchers.
// The caller holds s.mu.
func (s *Server) put(res *resource, obj *unstructured.Unstructured, typ watch.EventType) *unstructured.Unstructured {
	s.st.rv++
	obj.SetResourceVersion(strconv.FormatUint(s.st.rv, 10))
	m := s.st.objects[res.gvr.Resource]
	m[key(obj.GetNamespace(), obj.GetName())] = obj
	s.emit(event{typ: typ, res: res, obj: obj.DeepCopy(), rv: s.st.rv})
	s.kick()
	return obj
}

// remove deletes an object and garbage-collects its dependents (ownerReferences), as the
// garbage collector does in background propagation. The caller holds s.mu.
func (s *Server) remove(res *resource, ns, name string) {
	m := s.st.objects[res.gvr.Resource]
	obj := m[key(ns, name)]
	if obj == nil {
		return
	}
	delete(m, key(ns, name))
	s.st.rv++
	obj = obj.DeepCopy()
	obj.SetResourceVersion(strconv.FormatUint(s.st.rv, 10))
	s.emit(event{typ: watch.Deleted, res: res, obj: obj.DeepCopy(), rv: s.st.rv})
	if res.kind == "Sandbox" {
		s.stopPod(name)
	}
	uid := obj.GetUID()
	rs, _ := resources()
	for _, r := range rs {
		for _, o := range s.st.objects[r.gvr.Resource] {
			if o.GetNamespace() != ns {
				continue
			}
			for _, ref := range o.GetOwnerReferences() {
				if ref.UID == uid {
					s.remove(r, ns, o.GetName())
					break
				}
			}
		}
	}
	s.kick()
}

func (s *Server) emit(ev event) {
	s.st.history = append(s.st.history, ev)
	if len(s.st.history) > historyLimit {
		drop := len(s.st.history) - historyLimit
		s.st.oldestRV = s.st.history[drop-1].rv
		s.st.history = append([]event(nil), s.st.history[drop:]...)
	}
	for w := range s.st.watchers {
		if w.res != ev.res || (w.ns != "" && ev.obj.GetNamespace() != w.ns) || !w.match(ev.obj) {
			continue
		}
		select {
		case w.ch <- ev:
		default:
			// A watcher that cannot keep up is closed, as the API server does; the client
			// re-lists or resumes.
			w.close()
			delete(s.st.watchers, w)
		}
	}
}

// Compact forgets the event history, as etcd compaction does: a watch resuming from any resource
// version older than the current one gets 410 Gone.
func (s *Server) Compact() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.history = nil
	s.st.oldestRV = s.st.rv
}

// apiHandler serves the Kubernetes API.
func (s *Server) apiHandler(w http.ResponseWriter, r *http.Request) {
	withToken := r.Header.Get("Authorization") == "Bearer "+s.token
	rec := &Request{Path: r.URL.Path, Query: r.URL.RawQuery, WithToken: withToken}
	sw := &statusWriter{ResponseWriter: w}
	// A request is logged when its answer starts (a watch stays open long after).
	sw.onHeader = func(code int) {
		rec.Code = code
		s.reqMu.Lock()
		s.requests = append(s.requests, *rec)
		s.reqMu.Unlock()
	}
	if !withToken {
		rec.Verb = strings.ToLower(r.Method)
		writeStatus(sw, apierrors.NewUnauthorized("Unauthorized"))
		return
	}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case r.URL.Path == "/api":
		rec.Verb = "discovery"
		writeJSON(sw, http.StatusOK, map[string]any{"kind": "APIVersions", "versions": []string{"v1"},
			"serverAddressByClientCIDRs": []any{map[string]any{"clientCIDR": "0.0.0.0/0", "serverAddress": r.Host}}})
		return
	case r.URL.Path == "/api/v1":
		rec.Verb = "discovery"
		writeJSON(sw, http.StatusOK, map[string]any{"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1", "resources": []any{}})
		return
	case r.URL.Path == "/apis":
		rec.Verb = "discovery"
		s.serveGroups(sw)
		return
	case r.URL.Path == "/version":
		rec.Verb = "discovery"
		writeJSON(sw, http.StatusOK, map[string]any{"major": "1", "minor": "37", "gitVersion": "v1.37.2-agentsandboxtest"})
		return
	case len(parts) == 3 && parts[0] == "apis":
		rec.Verb = "discovery"
		s.serveResources(sw, parts[1], parts[2])
		return
	}
	// /apis/<group>/<version>/namespaces/<ns>/<resource>[/<name>]
	// /apis/<group>/<version>/<resource> (all namespaces)
	if len(parts) < 4 || parts[0] != "apis" {
		writeStatus(sw, apierrors.NewNotFound(schema.GroupResource{}, r.URL.Path))
		return
	}
	gv := schema.GroupVersion{Group: parts[1], Version: parts[2]}
	var ns, resName, name string
	switch {
	case len(parts) == 4:
		resName = parts[3]
	case len(parts) == 6 && parts[3] == "namespaces":
		ns, resName = parts[4], parts[5]
	case len(parts) == 7 && parts[3] == "namespaces":
		ns, resName, name = parts[4], parts[5], parts[6]
	default:
		writeStatus(sw, apierrors.NewNotFound(schema.GroupResource{}, r.URL.Path))
		return
	}
	rec.Resource = resName
	var res *resource
	rs, _ := resources()
	for _, x := range rs {
		if x.gvr.GroupVersion() == gv && x.gvr.Resource == resName {
			res = x
		}
	}
	if res == nil {
		rec.Verb = strings.ToLower(r.Method)
		writeStatus(sw, apierrors.NewNotFound(schema.GroupResource{Group: gv.Group, Resource: resName}, name))
		return
	}
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodGet && name != "":
		rec.Verb = "get"
		s.get(sw, res, ns, name)
	case r.Method == http.MethodGet && (q.Get("watch") == "true" || q.Get("watch") == "1"):
		rec.Verb = "watch"
		s.watch(sw, r, res, ns)
	case r.Method == http.MethodGet:
		rec.Verb = "list"
		s.list(sw, r, res, ns)
	case r.Method == http.MethodPost && name == "" && ns != "":
		rec.Verb = "create"
		s.create(sw, r, res, ns)
	case r.Method == http.MethodDelete && name != "":
		rec.Verb = "delete"
		s.delete(sw, res, ns, name)
	case r.Method == http.MethodPatch && name != "":
		rec.Verb = "patch"
		s.patch(sw, r, res, ns, name)
	default:
		rec.Verb = strings.ToLower(r.Method)
		writeStatus(sw, apierrors.NewMethodNotSupported(res.gvr.GroupResource(), r.Method))
	}
}

type statusWriter struct {
	http.ResponseWriter
	code     int
	onHeader func(int)
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
		if w.onHeader != nil {
			w.onHeader(code)
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeStatus writes err as the API server does: a metav1.Status with its code.
func writeStatus(w http.ResponseWriter, err error) {
	st := apierrors.APIStatus(nil)
	if se, ok := err.(apierrors.APIStatus); ok {
		st = se
	} else {
		st = apierrors.NewInternalError(err)
	}
	s := st.Status()
	s.Kind, s.APIVersion = "Status", "v1"
	writeJSON(w, int(s.Code), s)
}

func (s *Server) serveGroups(w http.ResponseWriter) {
	rs, _ := resources()
	seen := map[string]bool{}
	var groups []any
	for _, r := range rs {
		if seen[r.gvr.Group] {
			continue
		}
		seen[r.gvr.Group] = true
		gv := map[string]any{"groupVersion": r.gvr.GroupVersion().String(), "version": r.gvr.Version}
		groups = append(groups, map[string]any{"name": r.gvr.Group, "versions": []any{gv}, "preferredVersion": gv})
	}
	writeJSON(w, http.StatusOK, map[string]any{"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

func (s *Server) serveResources(w http.ResponseWriter, group, version string) {
	rs, _ := resources()
	var list []any
	for _, r := range rs {
		if r.gvr.Group != group || r.gvr.Version != version {
			continue
		}
		verbs := []string{"create", "delete", "get", "list", "watch"}
		if r.kind == "SandboxClaim" {
			verbs = append(verbs, "patch")
		}
		list = append(list, map[string]any{"name": r.gvr.Resource, "singularName": r.singular, "namespaced": true,
			"kind": r.kind, "verbs": verbs, "shortNames": r.shortNames})
	}
	if list == nil {
		writeStatus(w, apierrors.NewNotFound(schema.GroupResource{Group: group}, version))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"kind": "APIResourceList", "apiVersion": "v1",
		"groupVersion": schema.GroupVersion{Group: group, Version: version}.String(), "resources": list})
}

func (s *Server) get(w http.ResponseWriter, res *resource, ns, name string) {
	s.mu.Lock()
	obj := s.st.objects[res.gvr.Resource][key(ns, name)]
	if obj != nil {
		obj = obj.DeepCopy()
	}
	s.mu.Unlock()
	if obj == nil {
		writeStatus(w, apierrors.NewNotFound(res.gvr.GroupResource(), name))
		return
	}
	writeJSON(w, http.StatusOK, obj.Object)
}

// selector builds the match function of a list or watch from its labelSelector and
// fieldSelector (metadata.name and metadata.namespace are the fields a custom resource has).
func selector(r *http.Request, res *resource) (func(*unstructured.Unstructured) bool, error) {
	q := r.URL.Query()
	ls, err := labels.Parse(q.Get("labelSelector"))
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	fs, err := fields.ParseSelector(q.Get("fieldSelector"))
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	for _, req := range fs.Requirements() {
		if req.Field != "metadata.name" && req.Field != "metadata.namespace" {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("field label not supported: %s", req.Field))
		}
	}
	return func(o *unstructured.Unstructured) bool {
		return ls.Matches(labels.Set(o.GetLabels())) &&
			fs.Matches(fields.Set{"metadata.name": o.GetName(), "metadata.namespace": o.GetNamespace()})
	}, nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, res *resource, ns string) {
	match, err := selector(r, res)
	if err != nil {
		writeStatus(w, err)
		return
	}
	s.mu.Lock()
	var items []any
	for _, o := range s.st.objects[res.gvr.Resource] {
		if (ns == "" || o.GetNamespace() == ns) && match(o) {
			items = append(items, o.DeepCopy().Object)
		}
	}
	rv := s.st.rv
	s.mu.Unlock()
	sort.Slice(items, func(i, j int) bool {
		a, b := items[i].(map[string]any)["metadata"].(map[string]any), items[j].(map[string]any)["metadata"].(map[string]any)
		return fmt.Sprint(a["namespace"], "/", a["name"]) < fmt.Sprint(b["namespace"], "/", b["name"])
	})
	if items == nil {
		items = []any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"apiVersion": res.gvr.GroupVersion().String(), "kind": res.listKind,
		"metadata": map[string]any{"resourceVersion": strconv.FormatUint(rv, 10)}, "items": items})
}

func (s *Server) watch(w http.ResponseWriter, r *http.Request, res *resource, ns string) {
	match, err := selector(r, res)
	if err != nil {
		writeStatus(w, err)
		return
	}
	q := r.URL.Query()
	bookmarks := q.Get("allowWatchBookmarks") == "true"
	wt := &watcher{res: res, ns: ns, match: match, ch: make(chan event, 256), done: make(chan struct{})}
	s.mu.Lock()
	var initial []event
	if rvs := q.Get("resourceVersion"); rvs != "" && rvs != "0" {
		rv, err := strconv.ParseUint(rvs, 10, 64)
		if err != nil {
			s.mu.Unlock()
			writeStatus(w, apierrors.NewBadRequest("invalid resourceVersion "+rvs))
			return
		}
		if rv < s.st.oldestRV {
			s.mu.Unlock()
			writeStatus(w, apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", rv, s.st.oldestRV+1)))
			return
		}
		for _, ev := range s.st.history {
			if ev.rv > rv && ev.res == res && (ns == "" || ev.obj.GetNamespace() == ns) && match(ev.obj) {
				initial = append(initial, ev)
			}
		}
	} else {
		// No resource version (or "0"): synthetic ADDED events for what exists, then changes.
		var objs []*unstructured.Unstructured
		for _, o := range s.st.objects[res.gvr.Resource] {
			if (ns == "" || o.GetNamespace() == ns) && match(o) {
				objs = append(objs, o.DeepCopy())
			}
		}
		sort.Slice(objs, func(i, j int) bool { return objs[i].GetName() < objs[j].GetName() })
		for _, o := range objs {
			initial = append(initial, event{typ: watch.Added, res: res, obj: o})
		}
	}
	s.st.watchers[wt] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.st.watchers, wt)
		s.mu.Unlock()
		wt.close()
	}()

	timeout := 30 * time.Minute
	if ts := q.Get("timeoutSeconds"); ts != "" {
		if n, err := strconv.Atoi(ts); err == nil && n > 0 {
			timeout = time.Duration(n) * time.Second
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	send := func(typ watch.EventType, obj map[string]any) bool {
		if err := enc.Encode(map[string]any{"type": typ, "object": obj}); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	for _, ev := range initial {
		if !send(ev.typ, ev.obj.Object) {
			return
		}
	}
	bookmark := func() bool {
		s.mu.Lock()
		rv := s.st.rv
		s.mu.Unlock()
		return send(watch.Bookmark, map[string]any{"apiVersion": res.gvr.GroupVersion().String(), "kind": res.kind,
			"metadata": map[string]any{"resourceVersion": strconv.FormatUint(rv, 10)}})
	}
	var tick <-chan time.Time
	if bookmarks {
		if !bookmark() {
			return
		}
		t := time.NewTicker(s.bookmarkEvery)
		defer t.Stop()
		tick = t.C
	}
	end := time.NewTimer(timeout)
	defer end.Stop()
	for {
		select {
		case ev := <-wt.ch:
			if !send(ev.typ, ev.obj.Object) {
				return
			}
		case <-tick:
			if !bookmark() {
				return
			}
		case <-wt.done:
			return
		case <-end.C:
			return
		case <-r.Context().Done():
			return
		case <-s.closing:
			return
		}
	}
}

func decodeObject(r *http.Request) (*unstructured.Unstructured, error) {
	b, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, apierrors.NewBadRequest("the body of the request was in an unknown format: " + err.Error())
	}
	return &unstructured.Unstructured{Object: m}, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, res *resource, ns string) {
	obj, err := decodeObject(r)
	if err != nil {
		writeStatus(w, err)
		return
	}
	if res.kind == "SandboxClaim" {
		if err := s.takeCreateFault(); err != nil {
			writeStatus(w, err)
			return
		}
	}
	if obj.GetAPIVersion() != res.gvr.GroupVersion().String() || obj.GetKind() != res.kind {
		writeStatus(w, apierrors.NewBadRequest(fmt.Sprintf("the API version in the data (%s) does not match the expected API version (%s) or kind %q", obj.GetAPIVersion(), res.gvr.GroupVersion(), obj.GetKind())))
		return
	}
	if obj.GetNamespace() != "" && obj.GetNamespace() != ns {
		writeStatus(w, apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request"))
		return
	}
	obj.SetNamespace(ns)
	created, err := s.createObject(res, obj)
	if err != nil {
		writeStatus(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, created.Object)
}

// createObject validates, names and stores a new object, returning a copy of what was stored.
func (s *Server) createObject(res *resource, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.createLocked(res, obj)
}

func (s *Server) createLocked(res *resource, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	if obj.GetName() == "" && obj.GetGenerateName() != "" {
		for {
			n := obj.GetGenerateName() + rand.String(5)
			if s.st.objects[res.gvr.Resource][key(obj.GetNamespace(), n)] == nil {
				obj.SetName(n)
				break
			}
		}
	}
	delete(obj.Object, "status") // the status subresource: create ignores it
	if err := res.validate(obj, false); err != nil {
		return nil, err
	}
	if s.st.objects[res.gvr.Resource][key(obj.GetNamespace(), obj.GetName())] != nil {
		return nil, apierrors.NewAlreadyExists(res.gvr.GroupResource(), obj.GetName())
	}
	obj.SetUID(types.UID(uuid.NewUUID()))
	obj.SetCreationTimestamp(metav1.NewTime(s.now()))
	obj.SetGeneration(1)
	return s.put(res, obj, watch.Added).DeepCopy(), nil
}

func (s *Server) delete(w http.ResponseWriter, res *resource, ns, name string) {
	s.mu.Lock()
	obj := s.st.objects[res.gvr.Resource][key(ns, name)]
	if obj == nil {
		s.mu.Unlock()
		writeStatus(w, apierrors.NewNotFound(res.gvr.GroupResource(), name))
		return
	}
	out := obj.DeepCopy()
	s.remove(res, ns, name)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out.Object)
}

func (s *Server) patch(w http.ResponseWriter, r *http.Request, res *resource, ns, name string) {
	ct := r.Header.Get("Content-Type")
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	if res.kind != "SandboxClaim" {
		writeStatus(w, apierrors.NewMethodNotSupported(res.gvr.GroupResource(), "patch"))
		return
	}
	if ct != "application/merge-patch+json" {
		writeStatus(w, &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusUnsupportedMediaType,
			Reason: metav1.StatusReasonUnsupportedMediaType, Message: fmt.Sprintf("the body of the request was in an unknown format - accepted media types include: application/merge-patch+json; got %s", ct)}})
		return
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	if err != nil {
		writeStatus(w, apierrors.NewBadRequest(err.Error()))
		return
	}
	var p any
	if err := json.Unmarshal(b, &p); err != nil {
		writeStatus(w, apierrors.NewBadRequest(err.Error()))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.st.objects[res.gvr.Resource][key(ns, name)]
	if cur == nil {
		writeStatus(w, apierrors.NewNotFound(res.gvr.GroupResource(), name))
		return
	}
	merged, ok := mergePatch(cur.DeepCopy().Object, p).(map[string]any)
	if !ok {
		writeStatus(w, apierrors.NewBadRequest("a merge patch must be an object"))
		return
	}
	next := &unstructured.Unstructured{Object: merged}
	// Identity and status are the server's: the main resource ignores status changes.
	next.SetName(cur.GetName())
	next.SetNamespace(cur.GetNamespace())
	next.SetUID(cur.GetUID())
	next.SetCreationTimestamp(cur.GetCreationTimestamp())
	next.SetAPIVersion(cur.GetAPIVersion())
	next.SetKind(cur.GetKind())
	if st, ok := cur.Object["status"]; ok {
		next.Object["status"] = st
	} else {
		delete(next.Object, "status")
	}
	if rv := next.GetResourceVersion(); rv != "" && rv != cur.GetResourceVersion() {
		writeStatus(w, apierrors.NewConflict(res.gvr.GroupResource(), name, fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again")))
		return
	}
	status := next.Object["status"]
	delete(next.Object, "status")
	if err := res.validate(next, false); err != nil {
		writeStatus(w, err)
		return
	}
	if status != nil {
		next.Object["status"] = status
	}
	if fmt.Sprint(next.Object["spec"]) != fmt.Sprint(cur.Object["spec"]) {
		next.SetGeneration(cur.GetGeneration() + 1)
	}
	out := s.put(res, next, watch.Modified).DeepCopy()
	writeJSON(w, http.StatusOK, out.Object)
}

// mergePatch applies an RFC 7386 JSON merge patch.
func mergePatch(target, patch any) any {
	pm, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	tm, ok := target.(map[string]any)
	if !ok {
		tm = map[string]any{}
	}
	for k, v := range pm {
		if v == nil {
			delete(tm, k)
		} else {
			tm[k] = mergePatch(tm[k], v)
		}
	}
	return tm
}
