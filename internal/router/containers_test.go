package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/containers"
	"github.com/ciproxy/ciproxy/internal/intercept"
	"github.com/ciproxy/ciproxy/internal/sandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2b"
	"github.com/ciproxy/ciproxy/internal/sandbox/e2btest"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
	"github.com/ciproxy/ciproxy/internal/snapshot"
	"github.com/ciproxy/ciproxy/internal/store"
	"github.com/ciproxy/ciproxy/internal/store/embedded"
	"github.com/ciproxy/ciproxy/internal/store/storetest"
	"github.com/ciproxy/ciproxy/internal/testutil"
	"github.com/ciproxy/ciproxy/internal/testutil/localsandbox"
	"github.com/ciproxy/ciproxy/internal/upstream/upstreamtest"
)

// The Containers API through the real router over real sockets, with the official Go client, on
// both backends: e2b through its emulator (which executes in a local sandbox), and local.

// sandboxes is the local sandbox provider of this package's tests: the local tool, and what the
// e2b emulator executes in. It starts on first use; tests that need it skip without bubblewrap.
var sandboxes = localsandbox.New(local.Options{Tool: "cloud", PoolSize: 1})

func TestMain(m *testing.M) { testutil.Main(m, sandboxes.Close) }

var containerIDShape = regexp.MustCompile(`^cntr_[0-9a-f]{48}$`)

// containerBackend is a sandbox tool named "cloud" on one backend, shared by the processes a
// test starts (its sandboxes outlive a proxy process as the real ones do).
type containerBackend struct {
	name string
	emu  *e2btest.Server // nil for local
	reg  *sandbox.Registry
}

func newContainerBackend(t *testing.T, name string) *containerBackend {
	t.Helper()
	return newContainerBackendOn(t, name, sandboxes.Provider(t))
}

// newContainerBackendOn is newContainerBackend with the sandboxes of lp.
func newContainerBackendOn(t *testing.T, name string, lp *local.Provider) *containerBackend {
	t.Helper()
	b := &containerBackend{name: name}
	var entry sandbox.RegistryEntry
	switch name {
	case "e2b":
		b.emu = e2btest.New(lp)
		t.Cleanup(b.emu.Close)
		ep, err := e2b.New(e2b.Options{APIKey: b.emu.APIKey(), APIBase: b.emu.URL(), SandboxURL: b.emu.SandboxURL(), HTTPClient: b.emu.Client(), Tool: "cloud"})
		if err != nil {
			t.Fatal(err)
		}
		entry = sandbox.RegistryEntry{Name: "cloud", Provider: ep, Backend: "e2b"}
	case "local":
		entry = sandbox.RegistryEntry{Name: "cloud", Provider: lp, Backend: "local", HostBound: true}
	}
	reg, err := sandbox.NewRegistry(nil, entry)
	if err != nil {
		t.Fatal(err)
	}
	b.reg = reg
	return b
}

// live counts the backend's live sandboxes.
func (b *containerBackend) live(t *testing.T) int {
	if b.emu != nil {
		return b.emu.Live()
	}
	return sandboxes.Provider(t).Live()
}

// containersProxy is one proxy process: the router with the Files and Containers APIs over an
// embedded store in dir.
type containersProxy struct {
	*proxy
	st      *embedded.Store
	sess    *containers.Manager
	stopped bool
}

func containersConfig(mutate ...func(*config.Config)) *config.Config {
	return filesConfig(append([]func(*config.Config){func(c *config.Config) {
		c.Interception.SandboxToolName = "cloud"
		c.Interception.ContainerIdleTimeout = 20 * time.Minute
	}}, mutate...)...)
}

func (b *containerBackend) start(t *testing.T, cfg *config.Config, dir string, clock *storetest.Clock) *containersProxy {
	t.Helper()
	st, err := embedded.Open(embedded.Options{Dir: dir, Now: clock.Now, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := containers.New(context.Background(), containers.Options{Store: st, Now: clock.Now, SweepInterval: -1,
		Registry: func() *sandbox.Registry { return b.reg }})
	if err != nil {
		t.Fatal(err)
	}
	p := &containersProxy{st: st, sess: sess}
	p.proxy = newProxy(t, cfg, func(o *Options) {
		o.Store = snapshot.Fixed(&snapshot.Snapshot{Config: cfg, Sandboxes: b.reg})
		o.Files, o.Containers, o.Now = st, sess, clock.Now
		// The engine as cmd/proxy wires it; it takes requests only when cfg turns interception on.
		o.Interceptor = intercept.New(intercept.Options{Containers: sess, Files: st, Store: st})
	})
	t.Cleanup(p.stop)
	return p
}

// stop shuts the process down as cmd/proxy does: the server, then the Sessions, then the store.
func (p *containersProxy) stop() {
	if p.stopped {
		return
	}
	p.stopped = true
	p.Close()
	_ = p.sess.Close(context.Background())
	_ = p.st.Close()
}

func (p *containersProxy) client(key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(p.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

func apiError(t *testing.T, err error, status int, param string) {
	t.Helper()
	var e *openai.Error
	if !errors.As(err, &e) || e.StatusCode != status || e.Param != param {
		t.Errorf("error = %v; want HTTP %d naming %q", err, status, param)
	}
}

func content(t *testing.T, c openai.Client, containerID, fileID string) []byte {
	t.Helper()
	resp, err := c.Containers.Files.Content.Get(context.Background(), containerID, fileID)
	if err != nil {
		t.Fatalf("Files.Content.Get(%s) error = %v", fileID, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestContainersWithOpenAIClient(t *testing.T) {
	for _, backend := range []string{"e2b", "local"} {
		t.Run(backend, func(t *testing.T) { testContainersWithOpenAIClient(t, backend) })
	}
}

func testContainersWithOpenAIClient(t *testing.T, backend string) {
	b := newContainerBackend(t, backend)
	clock := storetest.NewClock()
	p := b.start(t, containersConfig(withMasterKey), t.TempDir(), clock)
	c := p.client(masterKey)
	ctx := context.Background()

	csv := []byte("region,sales\nnorth,10\nsouth,20\n")
	file, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(bytes.NewReader(csv), "sales.csv", "text/csv"), Purpose: openai.FilePurposeUserData})
	if err != nil {
		t.Fatal(err)
	}
	before := b.live(t)
	made, err := c.Containers.New(ctx, openai.ContainerNewParams{Name: "analysis", FileIDs: []string{file.ID},
		ExpiresAfter: openai.ContainerNewParamsExpiresAfter{Anchor: "last_active_at", Minutes: 30},
		MemoryLimit:  openai.ContainerNewParamsMemoryLimit4g})
	if err != nil {
		t.Fatalf("Containers.New() error = %v", err)
	}
	now := clock.Now().Unix()
	if !containerIDShape.MatchString(made.ID) || made.Object != "container" || made.Name != "analysis" || made.Status != "running" ||
		made.ExpiresAfter.Anchor != "last_active_at" || made.ExpiresAfter.Minutes != 30 || made.MemoryLimit != "4g" ||
		made.CreatedAt != now || made.LastActiveAt != now {
		t.Errorf("Containers.New() = %s", made.RawJSON())
	}
	if want := `{"id":"` + made.ID + `","object":"container","created_at":` + fmt.Sprint(now) + `,"status":"running","expires_after":{"anchor":"last_active_at","minutes":30},"last_active_at":` + fmt.Sprint(now) + `,"memory_limit":"4g","name":"analysis"}`; strings.TrimSpace(made.RawJSON()) != want {
		t.Errorf("container object\n%s\nwant OpenAI's keys in OpenAI's order\n%s", made.RawJSON(), want)
	}
	if got := b.live(t); got != before+1 {
		t.Errorf("backend live sandboxes %d; want one more than %d", got, before)
	}

	// The Files API file is in /mnt/data, listed as the user's.
	files, err := c.Containers.Files.List(ctx, made.ID, openai.ContainerFileListParams{})
	if err != nil || len(files.Data) != 1 {
		t.Fatalf("Files.List() = %+v, %v; want the placed file", files, err)
	}
	placed := files.Data[0]
	if !regexp.MustCompile(`^cfile_[0-9a-f]{32}$`).MatchString(placed.ID) || placed.Object != "container.file" ||
		placed.Path != "/mnt/data/sales.csv" || placed.Source != "user" || placed.Bytes != int64(len(csv)) || placed.ContainerID != made.ID {
		t.Errorf("placed file = %s", placed.RawJSON())
	}
	if got := content(t, c, made.ID, placed.ID); !bytes.Equal(got, csv) {
		t.Errorf("content of the placed file = %q; want the uploaded bytes", got)
	}

	// Uploads, by multipart and by file_id; the clash gets a free name.
	up, err := c.Containers.Files.New(ctx, made.ID, openai.ContainerFileNewParams{File: openai.File(strings.NewReader("a,b\n1,2\n"), "sales.csv", "text/csv")})
	if err != nil || up.Path != "/mnt/data/sales-1.csv" || up.Source != "user" || up.Bytes != 8 {
		t.Fatalf("Files.New(multipart) = %+v, %v; want /mnt/data/sales-1.csv", up, err)
	}
	byID, err := c.Containers.Files.New(ctx, made.ID, openai.ContainerFileNewParams{FileID: openai.String(file.ID)})
	if err != nil || byID.Path != "/mnt/data/sales-2.csv" || byID.Bytes != int64(len(csv)) {
		t.Fatalf("Files.New(file_id) = %+v, %v; want /mnt/data/sales-2.csv", byID, err)
	}
	status, _, body := p.do(t, http.MethodPost, "/v1/containers/"+made.ID+"/files", `{"file_id":"`+file.ID+`"}`, "Authorization", "Bearer "+masterKey)
	if status != http.StatusOK || !strings.Contains(string(body), `"path":"/mnt/data/sales-3.csv"`) {
		t.Errorf("POST files with a JSON body = %d %s; want the file placed as sales-3.csv", status, body)
	}

	// Code the tool runs writes files: they are listed with source assistant and download as
	// written. The tool reaches the container through the same Sessions, by its id.
	run, err := p.sess.Open(ctx, made.ID, callerID(masterKey))
	if err != nil {
		t.Fatalf("Sessions.Open(an API container) error = %v", err)
	}
	png := bytes.Repeat([]byte{0x89, 'P', 'N', 'G', 0, 1, 2, 255}, 1000)
	res, out, err := run.Execute(ctx, fmt.Sprintf(`rows = open("/mnt/data/sales.csv").read().splitlines()[1:]
open("/mnt/data/out.csv", "w").write("total\n%%d\n" %% sum(int(r.split(",")[1]) for r in rows))
open("/mnt/data/chart.png", "wb").write(bytes(%v))`, pyBytes(png)), sandbox.RunOptions{}, containerLimits(containersConfig()))
	p.sess.Release(ctx, run)
	if err != nil || res.Error != nil || len(out.Files) != 2 {
		t.Fatalf("Execute() = %+v, %+v, %v; want two files written", res.Error, out, err)
	}
	all, err := c.Containers.Files.List(ctx, made.ID, openai.ContainerFileListParams{Order: openai.ContainerFileListParamsOrderAsc})
	if err != nil || len(all.Data) != 6 {
		t.Fatalf("Files.List(asc) = %d files, %v; want 6", len(all.Data), err)
	}
	byPath := map[string]openai.ContainerFileListResponse{}
	for _, f := range all.Data {
		byPath[f.Path] = f
	}
	if f := byPath["/mnt/data/out.csv"]; f.Source != "assistant" || !bytes.Equal(content(t, c, made.ID, f.ID), []byte("total\n30\n")) {
		t.Errorf("out.csv = %s; want source assistant and the bytes the code wrote", f.RawJSON())
	}
	if f := byPath["/mnt/data/chart.png"]; f.Source != "assistant" || f.Bytes != int64(len(png)) || !bytes.Equal(content(t, c, made.ID, f.ID), png) {
		t.Errorf("chart.png = %s; want source assistant and the %d bytes the code wrote", f.RawJSON(), len(png))
	}
	got, err := c.Containers.Files.Get(ctx, made.ID, up.ID)
	if err != nil || got.ID != up.ID || got.Path != up.Path {
		t.Errorf("Files.Get() = %+v, %v", got, err)
	}
	// Container file paging: one per page, every file once.
	var paged []string
	iter := c.Containers.Files.ListAutoPaging(ctx, made.ID, openai.ContainerFileListParams{Limit: openai.Int(1)})
	for iter.Next() {
		paged = append(paged, iter.Current().ID)
	}
	if err := iter.Err(); err != nil || len(paged) != 6 || paged[0] != all.Data[5].ID || paged[5] != all.Data[0].ID {
		t.Errorf("ListAutoPaging(limit 1) = %v, %v; want the 6 files newest first", paged, err)
	}
	if err := c.Containers.Files.Delete(ctx, made.ID, up.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Containers.Files.Get(ctx, made.ID, up.ID); err == nil {
		t.Errorf("Files.Get(deleted) succeeded")
	} else {
		apiError(t, err, http.StatusNotFound, "file_id")
	}
	status, _, body = p.do(t, http.MethodDelete, "/v1/containers/"+made.ID+"/files/"+byID.ID, "", "Authorization", "Bearer "+masterKey)
	if status != http.StatusOK || strings.TrimSpace(string(body)) != `{"id":"`+byID.ID+`","object":"container.file.deleted","deleted":true}` {
		t.Errorf("DELETE container file = %d %s", status, body)
	}

	// The tool's own containers are listed too; the list pages newest first.
	tool, err := p.sess.Create(ctx, "cloud", callerID(masterKey), sandbox.CreateOptions{}, 20*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	p.sess.Release(ctx, tool)
	var ids []string
	for i := range 3 {
		cc, err := c.Containers.New(ctx, openai.ContainerNewParams{Name: fmt.Sprint("more-", i)})
		if err != nil {
			t.Fatal(err)
		}
		if cc.MemoryLimit != "1g" || cc.ExpiresAfter.Minutes != 20 {
			t.Errorf("a container with the defaults = %s; want memory 1g, 20 minutes", cc.RawJSON())
		}
		ids = append(ids, cc.ID)
	}
	var listed []string
	citer := c.Containers.ListAutoPaging(ctx, openai.ContainerListParams{Limit: openai.Int(2)})
	for citer.Next() {
		listed = append(listed, citer.Current().ID)
	}
	if want := []string{ids[2], ids[1], ids[0], tool.ID(), made.ID}; citer.Err() != nil || !slices.Equal(listed, want) {
		t.Errorf("ListAutoPaging(limit 2) = %v, %v; want %v", listed, citer.Err(), want)
	}
	asc, err := c.Containers.List(ctx, openai.ContainerListParams{Order: openai.ContainerListParamsOrderAsc, Limit: openai.Int(2), After: openai.String(tool.ID())})
	if err != nil || len(asc.Data) != 2 || asc.Data[0].ID != ids[0] || !asc.HasMore {
		t.Errorf("List(asc, after the tool's) = %s, %v", asc.RawJSON(), err)
	}
	named, err := c.Containers.List(ctx, openai.ContainerListParams{Name: openai.String("analysis")})
	if err != nil || len(named.Data) != 1 || named.Data[0].ID != made.ID {
		t.Errorf("List(name=analysis) = %s, %v", named.RawJSON(), err)
	}

	// Retrieving is a use; deleting ends the sandbox.
	clock.Advance(5 * time.Minute)
	g, err := c.Containers.Get(ctx, made.ID)
	if err != nil || g.LastActiveAt != clock.Now().Unix() || g.Status != "running" {
		t.Errorf("Containers.Get() = %+v, %v; want last_active_at now", g, err)
	}
	liveBefore := b.live(t)
	if err := c.Containers.Delete(ctx, made.ID); err != nil {
		t.Fatal(err)
	}
	if got := b.live(t); got != liveBefore-1 {
		t.Errorf("backend live sandboxes after Delete %d; want %d", got, liveBefore-1)
	}
	status, _, body = p.do(t, http.MethodDelete, "/containers/"+ids[0], "", "Authorization", "Bearer "+masterKey)
	if status != http.StatusOK || strings.TrimSpace(string(body)) != `{"id":"`+ids[0]+`","object":"container.deleted","deleted":true}` {
		t.Errorf("DELETE /containers/{id} (no /v1) = %d %s", status, body)
	}
	for _, path := range []string{"/v1/containers/" + made.ID, "/containers/" + made.ID + "/files", "/v1/containers/" + made.ID + "/files/" + placed.ID + "/content"} {
		status, _, body := p.do(t, http.MethodGet, path, "", "Authorization", "Bearer "+masterKey)
		if _, _, param, _ := decodeError(t, body); status != http.StatusNotFound || param != "container_id" {
			t.Errorf("GET %s after Delete = %d %s; want 404 on container_id", path, status, body)
		}
	}
}

// pyBytes writes b as a Python list literal.
func pyBytes(b []byte) string {
	var s strings.Builder
	s.WriteByte('[')
	for i, c := range b {
		if i > 0 {
			s.WriteByte(',')
		}
		fmt.Fprint(&s, c)
	}
	s.WriteByte(']')
	return s.String()
}

// Without a master key every key is its own owner: another key's containers do not exist for it.
func TestContainersCrossOwner(t *testing.T) {
	b := newContainerBackend(t, "e2b")
	p := b.start(t, containersConfig(), t.TempDir(), storetest.NewClock())
	alice, mallory := p.client("sk-alice"), p.client("sk-mallory")
	ctx := context.Background()
	c, err := alice.Containers.New(ctx, openai.ContainerNewParams{Name: "private"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := alice.Containers.Files.New(ctx, c.ID, openai.ContainerFileNewParams{File: openai.File(strings.NewReader("secret"), "s.txt", "text/plain")})
	if err != nil {
		t.Fatal(err)
	}
	malloryFile, err := mallory.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader("m"), "m.txt", "text/plain"), Purpose: openai.FilePurposeUserData})
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name string
		call func() error
	}{
		{"get", func() error { _, err := mallory.Containers.Get(ctx, c.ID); return err }},
		{"delete", func() error { return mallory.Containers.Delete(ctx, c.ID) }},
		{"list files", func() error {
			_, err := mallory.Containers.Files.List(ctx, c.ID, openai.ContainerFileListParams{})
			return err
		}},
		{"get file", func() error { _, err := mallory.Containers.Files.Get(ctx, c.ID, f.ID); return err }},
		{"content", func() error { _, err := mallory.Containers.Files.Content.Get(ctx, c.ID, f.ID); return err }},
		{"delete file", func() error { return mallory.Containers.Files.Delete(ctx, c.ID, f.ID) }},
		{"upload", func() error {
			_, err := mallory.Containers.Files.New(ctx, c.ID, openai.ContainerFileNewParams{File: openai.File(strings.NewReader("x"), "x.txt", "text/plain")})
			return err
		}},
		{"place by id", func() error {
			_, err := mallory.Containers.Files.New(ctx, c.ID, openai.ContainerFileNewParams{FileID: openai.String(malloryFile.ID)})
			return err
		}},
	}
	for _, tt := range checks {
		t.Run(tt.name, func(t *testing.T) { apiError(t, tt.call(), http.StatusNotFound, "container_id") })
	}
	if l, err := mallory.Containers.List(ctx, openai.ContainerListParams{}); err != nil || len(l.Data) != 0 {
		t.Errorf("mallory's List() = %s, %v; want nothing", l.RawJSON(), err)
	}
	// Alice cannot place mallory's file either.
	_, err = alice.Containers.Files.New(ctx, c.ID, openai.ContainerFileNewParams{FileID: openai.String(malloryFile.ID)})
	apiError(t, err, http.StatusNotFound, "file_id")
	_, err = alice.Containers.New(ctx, openai.ContainerNewParams{Name: "x", FileIDs: []string{malloryFile.ID}})
	apiError(t, err, http.StatusNotFound, "file_ids[0]")
	// Everything of alice's is intact.
	if got := content(t, alice, c.ID, f.ID); string(got) != "secret" {
		t.Errorf("alice's file after mallory's attempts = %q", got)
	}
	if g, err := alice.Containers.Get(ctx, c.ID); err != nil || g.Status != "running" {
		t.Errorf("alice's container after mallory's attempts = %+v, %v", g, err)
	}
}

// An expired container is shown as expired and refuses what needs its sandbox; the reaper deletes
// the sandbox.
func TestContainersExpired(t *testing.T) {
	b := newContainerBackend(t, "e2b")
	clock := storetest.NewClock()
	p := b.start(t, containersConfig(withMasterKey), t.TempDir(), clock)
	c := p.client(masterKey)
	ctx := context.Background()
	made, err := c.Containers.New(ctx, openai.ContainerNewParams{Name: "short", ExpiresAfter: openai.ContainerNewParamsExpiresAfter{Anchor: "last_active_at", Minutes: 1}})
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.Containers.Files.New(ctx, made.ID, openai.ContainerFileNewParams{File: openai.File(strings.NewReader("x"), "x.txt", "text/plain")})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(59 * time.Second)
	if g, err := c.Containers.Get(ctx, made.ID); err != nil || g.Status != "running" {
		t.Fatalf("Get() at 59 s = %+v, %v; want running", g, err)
	}
	clock.Advance(61 * time.Second) // 61 s after that Get, a use
	g, err := c.Containers.Get(ctx, made.ID)
	if err != nil || g.Status != "expired" {
		t.Fatalf("Get() past the idle timeout = %s, %v; want expired", g.RawJSON(), err)
	}
	l, err := c.Containers.List(ctx, openai.ContainerListParams{})
	if err != nil || len(l.Data) != 1 || l.Data[0].Status != "expired" {
		t.Errorf("List() = %s, %v; want it listed as expired", l.RawJSON(), err)
	}
	if files, err := c.Containers.Files.List(ctx, made.ID, openai.ContainerFileListParams{}); err != nil || len(files.Data) != 1 {
		t.Errorf("Files.List() of an expired container = %+v, %v; want its file still listed", files, err)
	}
	_, err = c.Containers.Files.Content.Get(ctx, made.ID, f.ID)
	apiError(t, err, http.StatusBadRequest, "container_id")
	_, err = c.Containers.Files.New(ctx, made.ID, openai.ContainerFileNewParams{File: openai.File(strings.NewReader("y"), "y.txt", "text/plain")})
	apiError(t, err, http.StatusBadRequest, "container_id")
	var e *openai.Error
	if errors.As(err, &e) && e.Code != "container_expired" {
		t.Errorf("upload into an expired container: code %q; want container_expired", e.Code)
	}
	if _, err := p.sess.Open(ctx, made.ID, callerID(masterKey)); !errors.Is(err, containers.ErrExpired) {
		t.Errorf("the tool's Open() of an expired container: error = %v; want ErrExpired", err)
	}
	if n := p.sess.Sweep(ctx); n != 1 || b.live(t) != 0 {
		t.Errorf("Sweep() = %d, backend live %d; want the expired sandbox deleted", n, b.live(t))
	}
	if err := c.Containers.Delete(ctx, made.ID); err != nil {
		t.Errorf("Delete(expired) error = %v", err)
	}
}

// A restart: the e2b container is still there and usable by its id; a local one is expired.
func TestContainersRestart(t *testing.T) {
	for _, backend := range []string{"e2b", "local"} {
		t.Run(backend, func(t *testing.T) {
			b := newContainerBackend(t, backend)
			clock := storetest.NewClock()
			dir := t.TempDir()
			cfg := containersConfig(withMasterKey)
			p := b.start(t, cfg, dir, clock)
			c := p.client(masterKey)
			ctx := context.Background()
			made, err := c.Containers.New(ctx, openai.ContainerNewParams{Name: "kept"})
			if err != nil {
				t.Fatal(err)
			}
			f, err := c.Containers.Files.New(ctx, made.ID, openai.ContainerFileNewParams{File: openai.File(strings.NewReader("before"), "b.txt", "text/plain")})
			if err != nil {
				t.Fatal(err)
			}
			p.stop()
			p = b.start(t, cfg, dir, clock)
			c = p.client(masterKey)
			g, err := c.Containers.Get(ctx, made.ID)
			if backend == "local" {
				if err != nil || g.Status != "expired" {
					t.Errorf("Get() after a restart = %s, %v; want expired: the sandbox died with the process", g.RawJSON(), err)
				}
				return
			}
			if err != nil || g.Status != "running" {
				t.Fatalf("Get() after a restart = %s, %v; want running", g.RawJSON(), err)
			}
			if got := content(t, c, made.ID, f.ID); string(got) != "before" {
				t.Errorf("content after a restart = %q; want what was uploaded before", got)
			}
			if _, err := c.Containers.Files.New(ctx, made.ID, openai.ContainerFileNewParams{File: openai.File(strings.NewReader("after"), "a.txt", "text/plain")}); err != nil {
				t.Errorf("upload after a restart error = %v", err)
			}
		})
	}
}

// Every bad input is an OpenAI-shaped 4xx naming the parameter, and changes nothing.
func TestContainersBadInput(t *testing.T) {
	b := newContainerBackend(t, "e2b")
	p := b.start(t, containersConfig(withMasterKey, func(c *config.Config) { c.General.MaxFileUploadSize = 1 << 10 }), t.TempDir(), storetest.NewClock())
	c := p.client(masterKey)
	ctx := context.Background()
	file, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader("ok"), "ok.txt", "text/plain"), Purpose: openai.FilePurposeUserData})
	if err != nil {
		t.Fatal(err)
	}
	made, err := c.Containers.New(ctx, openai.ContainerNewParams{Name: "target"})
	if err != nil {
		t.Fatal(err)
	}
	auth := []string{"Authorization", "Bearer " + masterKey}
	deep := strings.Repeat("[", 100000)
	creates := []struct {
		name, body, param, code string
		status                  int
	}{
		{"not JSON", `{"name":`, "", "", 400},
		{"not an object", `["name"]`, "", "", 400},
		{"nested too deep", `{"name":"x","file_ids":` + deep + `}`, "", "", 400},
		{"no name", `{}`, "name", "", 400},
		{"name not a string", `{"name":7}`, "name", "invalid_type", 400},
		{"name too long", `{"name":"` + strings.Repeat("n", 257) + `"}`, "name", "string_above_max_length", 400},
		{"file_ids not an array", `{"name":"x","file_ids":"file-1"}`, "file_ids", "invalid_type", 400},
		{"file_ids entry not a string", `{"name":"x","file_ids":[1]}`, "file_ids[0]", "invalid_type", 400},
		{"unknown file", `{"name":"x","file_ids":["` + file.ID + `","file-0000000000000000000000"]}`, "file_ids[1]", "", 404},
		{"malformed file id", `{"name":"x","file_ids":["../../etc/passwd"]}`, "file_ids[0]", "", 404},
		{"anchor", `{"name":"x","expires_after":{"anchor":"created_at","minutes":5}}`, "expires_after.anchor", "invalid_value", 400},
		{"no minutes", `{"name":"x","expires_after":{"anchor":"last_active_at"}}`, "expires_after.minutes", "", 400},
		{"minutes a string", `{"name":"x","expires_after":{"anchor":"last_active_at","minutes":"5"}}`, "expires_after.minutes", "invalid_type", 400},
		{"minutes a decimal", `{"name":"x","expires_after":{"anchor":"last_active_at","minutes":1.5}}`, "expires_after.minutes", "invalid_type", 400},
		{"minutes 0", `{"name":"x","expires_after":{"anchor":"last_active_at","minutes":0}}`, "expires_after.minutes", "integer_below_min_value", 400},
		{"minutes over a day", `{"name":"x","expires_after":{"anchor":"last_active_at","minutes":1441}}`, "expires_after.minutes", "integer_above_max_value", 400},
		{"memory_limit", `{"name":"x","memory_limit":"2g"}`, "memory_limit", "invalid_value", 400},
		{"network allowlist", `{"name":"x","network_policy":{"type":"allowlist","allowed_domains":["pypi.org"]}}`, "network_policy", "unsupported_value", 400},
		{"network type", `{"name":"x","network_policy":{"type":"open"}}`, "network_policy.type", "invalid_value", 400},
		{"skills", `{"name":"x","skills":[{"type":"skill_reference","skill_id":"s"}]}`, "skills", "unsupported_value", 400},
	}
	liveBefore := b.live(t)
	for _, tt := range creates {
		t.Run("create/"+tt.name, func(t *testing.T) {
			status, _, body := p.do(t, http.MethodPost, "/v1/containers", tt.body, auth...)
			_, _, param, code := decodeError(t, body)
			if status != tt.status || param != tt.param || code != tt.code {
				t.Errorf("POST /v1/containers %s = %d %s; want %d, param %q, code %q", tt.body[:min(len(tt.body), 80)], status, body, tt.status, tt.param, tt.code)
			}
		})
	}
	if l, _ := c.Containers.List(ctx, openai.ContainerListParams{}); len(l.Data) != 1 || b.live(t) != liveBefore {
		t.Errorf("after the refused creates: %d containers, %d sandboxes (from %d); want nothing made", len(l.Data), b.live(t), liveBefore)
	}
	// Network policy "disabled" is what every container here has; it is accepted.
	if status, _, body := p.do(t, http.MethodPost, "/v1/containers", `{"name":"ok","network_policy":{"type":"disabled"},"skills":[]}`, auth...); status != 200 {
		t.Errorf("a disabled network policy = %d %s; want 200", status, body)
	}

	lists := []struct{ query, param, code string }{
		{"limit=0", "limit", "integer_below_min_value"},
		{"limit=101", "limit", "integer_above_max_value"},
		{"limit=x", "limit", "invalid_value"},
		{"order=up", "order", "invalid_value"},
		{"after=cntr_bad", "after", "invalid_value"},
		{"after=" + file.ID, "after", "invalid_value"},
	}
	for _, tt := range lists {
		for _, path := range []string{"/v1/containers?", "/v1/containers/" + made.ID + "/files?"} {
			status, _, body := p.do(t, http.MethodGet, path+tt.query, "", auth...)
			if _, _, param, code := decodeError(t, body); status != 400 || param != tt.param || code != tt.code {
				t.Errorf("GET %s%s = %d %s; want 400, param %q, code %q", path, tt.query, status, body, tt.param, tt.code)
			}
		}
	}

	unknown := "/v1/containers/" + made.ID + "/files/cfile_00000000000000000000000000000000"
	for _, tt := range []struct{ method, path, param string }{
		{http.MethodGet, "/v1/containers/cntr_nope", "container_id"},
		{http.MethodGet, "/v1/containers/" + strings.Repeat("a", 300), "container_id"},
		{http.MethodDelete, "/v1/containers/cntr_000000000000000000000000000000000000000000000000", "container_id"},
		{http.MethodGet, unknown, "file_id"},
		{http.MethodGet, unknown + "/content", "file_id"},
		{http.MethodDelete, unknown, "file_id"},
		{http.MethodGet, "/v1/containers/" + made.ID + "/files/nope", "file_id"},
	} {
		status, _, body := p.do(t, tt.method, tt.path, "", auth...)
		if _, _, param, _ := decodeError(t, body); status != 404 || param != tt.param {
			t.Errorf("%s %s = %d %s; want 404 on %q", tt.method, tt.path, status, body, tt.param)
		}
	}

	type upload struct {
		name, contentType, body, param, code string
		status                               int
	}
	mp := func(parts ...part) (string, string) { b, ct := multipartBody(form(parts)); return ct, b }
	ct1, b1 := mp(part{"purpose", "x", ""})
	ct2, b2 := mp(part{"file_id", file.ID, ""}, part{"file", "a", "a.txt"})
	ct3, b3 := mp(part{"file", "a", "a.txt"}, part{"file_id", file.ID, ""})
	ct4, b4 := mp(part{"file", "a", ".."})
	ct5, b5 := mp(part{"file", strings.Repeat("b", 1025), "big.bin"})
	ct6, b6 := mp(part{"file_id", "file-0000000000000000000000", ""})
	ct7, b7 := mp(part{"file", "a", "a.txt"}, part{"file", "b", "b.txt"})
	uploads := []upload{
		{"no content type", "", "x", "", "", 400},
		{"text/plain", "text/plain", "x", "", "", 400},
		{"JSON without file_id", "application/json", `{}`, "file_id", "", 400},
		{"JSON file_id not a string", "application/json", `{"file_id":1}`, "file_id", "invalid_type", 400},
		{"JSON unknown file_id", "application/json", `{"file_id":"file-0000000000000000000000"}`, "file_id", "", 404},
		{"JSON not JSON", "application/json", `{"file_id":`, "", "", 400},
		{"form without a file", ct1, b1, "file", "", 400},
		{"file_id, then a file", ct2, b2, "file_id", "", 400},
		{"a file, then file_id", ct3, b3, "file_id", "", 400},
		{"bad filename", ct4, b4, "file", "invalid_filename", 400},
		{"over max_file_upload_size", ct5, b5, "file", "file_too_large", 413},
		{"form with an unknown file_id", ct6, b6, "file_id", "", 404},
		{"two files", ct7, b7, "file", "", 400},
	}
	for _, tt := range uploads {
		t.Run("upload/"+tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, p.URL+"/v1/containers/"+made.ID+"/files", strings.NewReader(tt.body))
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			req.Header.Set("Authorization", "Bearer "+masterKey)
			resp, err := p.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			_, _, param, code := decodeError(t, body)
			if resp.StatusCode != tt.status || param != tt.param || code != tt.code {
				t.Errorf("upload = %d %s; want %d, param %q, code %q", resp.StatusCode, body, tt.status, tt.param, tt.code)
			}
		})
	}
	if files, err := c.Containers.Files.List(ctx, made.ID, openai.ContainerFileListParams{}); err != nil || len(files.Data) != 0 {
		t.Errorf("after the refused uploads: %d files, %v; want none", len(files.Data), err)
	}
	run, err := p.sess.Open(ctx, made.ID, callerID(masterKey))
	if err != nil {
		t.Fatal(err)
	}
	res, err := run.Run(ctx, `import os; sorted(os.listdir("/mnt/data")) if os.path.isdir("/mnt/data") else []`, sandbox.RunOptions{})
	p.sess.Release(ctx, run)
	if err != nil || len(res.Results) != 1 || res.Results[0].Text != "[]" {
		t.Errorf("/mnt/data after the refused uploads = %+v, %v; want nothing left", res.Results, err)
	}

	// The container's total: what one key may store.
	small := b.start(t, containersConfig(withMasterKey, func(c *config.Config) { c.General.MaxFileStoragePerKey = 10 }), t.TempDir(), storetest.NewClock())
	sc := small.client(masterKey)
	sm, err := sc.Containers.New(ctx, openai.ContainerNewParams{Name: "small"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Containers.Files.New(ctx, sm.ID, openai.ContainerFileNewParams{File: openai.File(strings.NewReader("0123456789"), "a.txt", "text/plain")}); err != nil {
		t.Fatal(err)
	}
	_, err = sc.Containers.Files.New(ctx, sm.ID, openai.ContainerFileNewParams{File: openai.File(strings.NewReader("x"), "b.txt", "text/plain")})
	apiError(t, err, http.StatusBadRequest, "file")
}

// The store keeps containers apart from the id the client sees: nothing of the sandbox's handle
// (its access token) reaches a client.
func TestContainersHideTheHandle(t *testing.T) {
	b := newContainerBackend(t, "e2b")
	p := b.start(t, containersConfig(withMasterKey), t.TempDir(), storetest.NewClock())
	ctx := context.Background()
	cl := p.client(masterKey)
	made, err := cl.Containers.New(ctx, openai.ContainerNewParams{Name: "x"})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := p.st.Container(ctx, callerID(masterKey), made.ID)
	if err != nil || len(rec.Handle) == 0 {
		t.Fatalf("store record = %+v, %v", rec, err)
	}
	var h sandbox.Handle
	if err := json.Unmarshal(rec.Handle, &h); err != nil || h.AccessToken == "" {
		t.Fatalf("the record's handle %s holds no access token (%v)", rec.Handle, err)
	}
	for _, path := range []string{"/v1/containers", "/v1/containers/" + made.ID} {
		_, _, body := p.do(t, http.MethodGet, path, "", "Authorization", "Bearer "+masterKey)
		if strings.Contains(string(body), h.AccessToken) || strings.Contains(string(body), h.ID) {
			t.Errorf("GET %s shows the sandbox's id or access token: %s", path, body)
		}
	}
}

// A client that leaves in the middle of a container file upload leaves no file: no record, and
// nothing visible in /mnt/data.
func TestContainerFileUploadCut(t *testing.T) {
	for _, backend := range []string{"e2b", "local"} {
		t.Run(backend, func(t *testing.T) {
			b := newContainerBackend(t, backend)
			p := b.start(t, containersConfig(), t.TempDir(), storetest.NewClock())
			ctx := context.Background()
			cl := p.client("")
			made, err := cl.Containers.New(ctx, openai.ContainerNewParams{Name: "cut"})
			if err != nil {
				t.Fatal(err)
			}
			body, ct := multipartBody(form{{"file", strings.Repeat("z", 1<<20), "cut.bin"}})
			conn, err := net.Dial("tcp", p.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "POST /v1/containers/%s/files HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", made.ID, ct, len(body))
			if _, err := io.WriteString(conn, body[:len(body)/2]); err != nil {
				t.Fatal(err)
			}
			conn.Close() // half a megabyte is in the socket: the handler streams it, then meets the cut
			testutil.Eventually(t, "the cut upload to end", func() bool {
				return p.logs.FilterMessage("request").FilterField(zap.String("path", "/v1/containers/"+made.ID+"/files")).Len() > 0
			})
			run, err := p.sess.Open(ctx, made.ID, "")
			if err != nil {
				t.Fatal(err)
			}
			defer p.sess.Release(ctx, run)
			res, out, err := run.Execute(ctx, `import os
sorted(n for n in os.listdir("/mnt/data") if not n.startswith(".")) if os.path.isdir("/mnt/data") else []`, sandbox.RunOptions{}, containers.ContainerLimits{})
			if err != nil || len(res.Results) != 1 || res.Results[0].Text != "[]" || len(out.Files) != 0 {
				t.Errorf("/mnt/data after a cut upload = %+v, %+v, %v; want nothing", res.Results, out, err)
			}
			if l, err := p.sess.Files(ctx, "", made.ID, store.ContainerFileQuery{}); err != nil || len(l.Items) != 0 {
				t.Errorf("files after a cut upload = %+v, %v; want none", l.Items, err)
			}
		})
	}
}

// With container_idle_timeout 0 (the tool's containers end with their request), a container made
// through the API still lives OpenAI's 20 idle minutes: it is made to be used later.
func TestContainersIdleZeroConfig(t *testing.T) {
	b := newContainerBackend(t, "e2b")
	clock := storetest.NewClock()
	p := b.start(t, containersConfig(func(c *config.Config) { c.Interception.ContainerIdleTimeout = 0 }), t.TempDir(), clock)
	c := p.client("")
	ctx := context.Background()
	made, err := c.Containers.New(ctx, openai.ContainerNewParams{Name: "later"})
	if err != nil || made.ExpiresAfter.Minutes != 20 {
		t.Fatalf("Containers.New() = %s, %v; want 20 minutes", made.RawJSON(), err)
	}
	clock.Advance(19 * time.Minute)
	if g, err := c.Containers.Get(ctx, made.ID); err != nil || g.Status != "running" || b.live(t) != 1 {
		t.Errorf("Get() 19 minutes on = %s, %v (%d sandboxes); want running", g.RawJSON(), err, b.live(t))
	}
}

// Code that swaps a container file for a link to a host file, or for a FIFO, gets no host bytes
// out through the download: the proxy never follows what the code made.
func TestContainerFileContentNeverFollowsLinks(t *testing.T) {
	for _, backend := range []string{"local", "e2b"} {
		t.Run(backend, func(t *testing.T) {
			b := newContainerBackend(t, backend)
			p := b.start(t, containersConfig(), t.TempDir(), storetest.NewClock())
			c := p.client("")
			ctx := context.Background()
			made, err := c.Containers.New(ctx, openai.ContainerNewParams{Name: "hostile"})
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, name := range []string{"a.txt", "b.txt"} {
				f, err := c.Containers.Files.New(ctx, made.ID, openai.ContainerFileNewParams{File: openai.File(strings.NewReader("mine"), name, "text/plain")})
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, f.ID)
			}
			run, err := p.sess.Open(ctx, made.ID, "")
			if err != nil {
				t.Fatal(err)
			}
			res, err := run.Run(ctx, `import os
os.remove("/mnt/data/a.txt"); os.symlink("/etc/passwd", "/mnt/data/a.txt")
os.remove("/mnt/data/b.txt"); os.mkfifo("/mnt/data/b.txt")`, sandbox.RunOptions{})
			p.sess.Release(ctx, run)
			if err != nil || res.Error != nil {
				t.Fatalf("Run() = %+v, %v", res.Error, err)
			}
			for _, id := range ids {
				status, _, body := p.do(t, http.MethodGet, "/v1/containers/"+made.ID+"/files/"+id+"/content", "")
				if status != http.StatusNotFound || strings.Contains(string(body), "root:") {
					t.Errorf("content of a file the code replaced = %d %q; want 404 and no host bytes", status, body)
				}
			}
		})
	}
}

// Conflicts inside the sandbox are answers, never "container not found" or a 500: an upload over
// a directory or link the code made gets a free name, as over a file; files the sandbox's disk
// cannot take, named by file_ids or uploaded, are 400 storage_limit_exceeded.
func TestContainerFileConflicts(t *testing.T) {
	sandboxes.Provider(t) // skips without a local sandbox
	lp, err := local.New(local.Options{Tool: "cloud", PoolSize: -1, MaxDiskSize: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lp.Close(context.Background()) })
	for _, backend := range []string{"local", "e2b"} {
		t.Run(backend, func(t *testing.T) {
			b := newContainerBackendOn(t, backend, lp)
			p := b.start(t, containersConfig(), t.TempDir(), storetest.NewClock())
			c := p.client("")
			ctx := context.Background()
			made, err := c.Containers.New(ctx, openai.ContainerNewParams{Name: "conflicts"})
			if err != nil {
				t.Fatal(err)
			}
			run, err := p.sess.Open(ctx, made.ID, "")
			if err != nil {
				t.Fatal(err)
			}
			res, err := run.Run(ctx, `import os
os.mkdir("/mnt/data/data.csv")
os.symlink("/etc/passwd", "/mnt/data/notes.txt")`, sandbox.RunOptions{})
			p.sess.Release(ctx, run)
			if err != nil || res.Error != nil {
				t.Fatalf("Run() = %+v, %v", res.Error, err)
			}
			for name, want := range map[string]string{"data.csv": "/mnt/data/data-1.csv", "notes.txt": "/mnt/data/notes-1.txt"} {
				f, err := c.Containers.Files.New(ctx, made.ID, openai.ContainerFileNewParams{File: openai.File(strings.NewReader("mine"), name, "text/plain")})
				if err != nil {
					t.Errorf("upload over the code's %s: %v; want a free name", name, err)
					continue
				}
				if f.Path != want || string(content(t, c, made.ID, f.ID)) != "mine" {
					t.Errorf("upload over the code's %s: path %s; want %s with its bytes", name, f.Path, want)
				}
			}

			big := bytes.Repeat([]byte("b"), 3<<20) // under max_file_upload_size, over the disk
			file, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(bytes.NewReader(big), "big.bin", "application/octet-stream"), Purpose: openai.FilePurposeUserData})
			if err != nil {
				t.Fatal(err)
			}
			full := func(what string, status int, body []byte, param string) {
				t.Helper()
				var e struct {
					Error struct{ Param, Code string }
				}
				if json.Unmarshal(body, &e) != nil || status != http.StatusBadRequest || e.Error.Param != param || e.Error.Code != "storage_limit_exceeded" {
					t.Errorf("%s = %d %s; want 400 storage_limit_exceeded naming %s", what, status, body, param)
				}
			}
			status, _, body := p.do(t, http.MethodPost, "/v1/containers", `{"name":"big","file_ids":["`+file.ID+`"]}`)
			full("a container with file_ids over its disk", status, body, "file_ids[0]")
			upload, ct := multipartBody(form{{"file", string(big), "big.bin"}})
			status, _, body = p.do(t, http.MethodPost, "/v1/containers/"+made.ID+"/files", upload, "Content-Type", ct)
			full("an upload over the disk", status, body, "file")
			if l, err := p.sess.Files(ctx, "", made.ID, store.ContainerFileQuery{}); err != nil || len(l.Items) != 2 {
				t.Errorf("files after the refusals = %+v, %v; want the two uploads", l.Items, err)
			}
		})
	}
}

// TestNetworkPolicyOneRule: the Containers API and the code_interpreter tool's auto container
// judge network_policy by one rule: what one refuses the other refuses with the same 400 (the
// param named from where it sits), and what one accepts the other accepts.
func TestNetworkPolicyOneRule(t *testing.T) {
	up := upstreamtest.New(t)
	b := newContainerBackend(t, "local")
	cfg := containersConfig(withMasterKey, func(c *config.Config) {
		c.Models = []config.Deployment{deployment("gpt-test", up.URL())}
		c.Callbacks = []string{"code_interpreter_interception"}
		c.Interception.Enabled = true
	})
	p := b.start(t, cfg, t.TempDir(), storetest.NewClock())
	auth := []string{"Authorization", "Bearer " + masterKey}
	const toolParam = "tools[0].container."
	cases := []struct {
		name, policy string
		status       int
		param, code  string // of the containers route
	}{
		{"allowlist", `{"type":"allowlist","allowed_domains":["pypi.org"]}`, 400, "network_policy", "unsupported_value"},
		{"unknown type", `{"type":"open"}`, 400, "network_policy.type", "invalid_value"},
		{"no type", `{}`, 400, "network_policy.type", "missing_required_parameter"},
		{"no domains", `{"type":"allowlist"}`, 400, "network_policy.allowed_domains", "missing_required_parameter"},
		{"empty domains", `{"type":"allowlist","allowed_domains":[]}`, 400, "network_policy.allowed_domains", "empty_array"},
		{"domain not a string", `{"type":"allowlist","allowed_domains":[1]}`, 400, "network_policy.allowed_domains[0]", "invalid_type"},
		{"empty domain", `{"type":"allowlist","allowed_domains":[""]}`, 400, "network_policy.allowed_domains[0]", "empty_string"},
		{"IP literal", `{"type":"allowlist","allowed_domains":["pypi.org","169.254.169.254"]}`, 400, "network_policy.allowed_domains[1]", "invalid_value"},
		{"unknown key", `{"type":"allowlist","allowed_domains":["pypi.org"],"ports":[80]}`, 400, "network_policy.ports", "unknown_parameter"},
		{"unknown key when disabled", `{"type":"disabled","allowed_domains":["pypi.org"]}`, 400, "network_policy.allowed_domains", "unknown_parameter"},
		{"empty secrets", `{"type":"allowlist","allowed_domains":["pypi.org"],"domain_secrets":[]}`, 400, "network_policy.domain_secrets", "empty_array"},
		{"secret without value", `{"type":"allowlist","allowed_domains":["pypi.org"],"domain_secrets":[{"domain":"pypi.org","name":"K"}]}`, 400, "network_policy.domain_secrets[0].value", "missing_required_parameter"},
		{"secret bad name", `{"type":"allowlist","allowed_domains":["pypi.org"],"domain_secrets":[{"domain":"pypi.org","name":"$K","value":"v"}]}`, 400, "network_policy.domain_secrets[0].name", "invalid_value"},
		{"not an object", `"disabled"`, 400, "network_policy", "invalid_type"},
		{"disabled", `{"type":"disabled"}`, 200, "", ""},
		{"null", `null`, 200, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cStatus, _, cBody := p.do(t, http.MethodPost, "/v1/containers", `{"name":"x","network_policy":`+tc.policy+`}`, auth...)
			if tc.status == http.StatusOK {
				up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("done")}})
			}
			rStatus, _, rBody := p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"hi","tools":[{"type":"code_interpreter","container":{"type":"auto","network_policy":`+tc.policy+`}}]}`, auth...)
			if cStatus != tc.status || rStatus != tc.status {
				t.Fatalf("containers %d %s, responses %d %s; want %d on both", cStatus, cBody, rStatus, rBody, tc.status)
			}
			if tc.status == http.StatusOK {
				return
			}
			cMsg, cType, cParam, cCode := decodeError(t, cBody)
			rMsg, rType, rParam, rCode := decodeError(t, rBody)
			if cParam != tc.param || cCode != tc.code || rParam != toolParam+cParam || rCode != cCode || rType != cType ||
				strings.ReplaceAll(rMsg, toolParam, "") != cMsg {
				t.Errorf("containers %s\nresponses %s\nwant the same error, param %q (under %s on the tool), code %q", cBody, rBody, tc.param, toolParam, tc.code)
			}
		})
	}
}

// TestContainersHaveMntData: a container made by POST /v1/containers has /mnt/data before its
// first code runs, as an auto one does and as OpenAI's always do, on both backends (e2b's
// template has no /mnt/data of its own; its emulator has none either).
func TestContainersHaveMntData(t *testing.T) {
	for _, backend := range []string{"e2b", "local"} {
		t.Run(backend, func(t *testing.T) {
			up := upstreamtest.New(t)
			b := newContainerBackend(t, backend)
			cfg := containersConfig(withMasterKey, func(c *config.Config) {
				c.Models = []config.Deployment{deployment("gpt-test", up.URL())}
				c.Callbacks = []string{"code_interpreter_interception"}
				c.Interception.Enabled = true
			})
			p := b.start(t, cfg, t.TempDir(), storetest.NewClock())
			auth := []string{"Authorization", "Bearer " + masterKey}
			code := `{"code":"open('/mnt/data/state.txt', 'w').write('kept')\nprint(open('/mnt/data/state.txt').read())"}`
			for _, container := range []string{"", `{"type":"auto"}`} {
				if container == "" {
					status, _, body := p.do(t, http.MethodPost, "/v1/containers", `{"name":"made"}`, auth...)
					if status != http.StatusOK {
						t.Fatalf("POST /v1/containers = %d %s", status, body)
					}
					container = `"` + gjson.GetBytes(body, "id").String() + `"`
				}
				up.Enqueue(upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.FunctionCall("python", code)}},
					upstreamtest.Turn{Items: []upstreamtest.Item{upstreamtest.Text("done")}})
				status, _, body := p.do(t, http.MethodPost, "/v1/responses", `{"model":"gpt-test","input":"write state","include":["code_interpreter_call.outputs"],
					"tools":[{"type":"code_interpreter","container":`+container+`}]}`, auth...)
				call := gjson.GetBytes(body, `output.#(type=="code_interpreter_call")`)
				if status != http.StatusOK || call.Get("status").String() != "completed" || call.Get("outputs.0.logs").String() != "kept\n" {
					t.Errorf("container %s: %d, call %s; want a completed call that printed kept", container, status, call.Raw)
				}
			}
		})
	}
}
