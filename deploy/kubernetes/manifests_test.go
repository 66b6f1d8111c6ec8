// Package kubernetes_test checks the manifests in this directory without a cluster: each document
// decodes strictly into its Kubernetes API type (an unknown or misspelt field fails, as
// `kubectl apply --validate=strict` would), and the settings that make the proxy's pod start and
// keep it confined are what docs/deploy.md says they are.
package kubernetes_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/ciproxy/ciproxy/internal/config"
	"github.com/ciproxy/ciproxy/internal/sandbox/backends"
	"github.com/ciproxy/ciproxy/internal/sandbox/local"
)

const (
	imageUID       = 10001 // the image's user (Dockerfile)
	seccompProfile = "ciproxy/seccomp.json"
	configMount    = "/etc/ciproxy"
	dataDir        = "/var/lib/ciproxy"
	// unwind is what the proxy takes past shutdown_grace at most: finalWindow (5s) for the ended
	// requests to say so, then cleanupTimeout (30s) to delete the sandboxes and close the store
	// (cmd/proxy/app.go).
	unwind = 35 * time.Second
)

// addedCapabilities are the capabilities a container may add back after dropping ALL: none, since
// bubblewrap runs unprivileged and takes what building a sandbox needs in its own user namespace.
var addedCapabilities = map[string][]corev1.Capability{}

// manifests holds every object of the directory, by kind and name.
type manifests struct {
	deployments  map[string]*appsv1.Deployment
	statefulSets map[string]*appsv1.StatefulSet
	services     map[string]*corev1.Service
	configMaps   map[string]*corev1.ConfigMap
	secrets      map[string]*corev1.Secret
	pdbs         map[string]*policyv1.PodDisruptionBudget
	// What agent-sandbox/ adds: its RBAC, the RuntimeClass, and agent-sandbox's own resources
	// (kept as decoded JSON objects, by kind then name: their schemas are CRDs, not Go types).
	namespaces      map[string]*corev1.Namespace
	serviceAccounts map[string]*corev1.ServiceAccount
	roles           map[string]*rbacv1.Role
	roleBindings    map[string]*rbacv1.RoleBinding
	runtimeClasses  map[string]*nodev1.RuntimeClass
	custom          map[string]map[string]map[string]any
}

// decodeStrict decodes one document into the API type of its kind with the API machinery's strict
// deserializer: an unknown field, a field spelt in another case and a duplicate field all fail.
func decodeStrict(m *manifests, doc []byte) error {
	scheme := runtime.NewScheme()
	if custom, err := decodeCustom(m, doc); custom {
		return err
	}
	for _, add := range []func(*runtime.Scheme) error{appsv1.AddToScheme, corev1.AddToScheme, policyv1.AddToScheme,
		rbacv1.AddToScheme, nodev1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	obj, gvk, err := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer().Decode(doc, nil, nil)
	if err != nil {
		return err
	}
	meta, ok := obj.(metav1.Object)
	if !ok || meta.GetName() == "" {
		return errors.New(gvk.Kind + " without metadata.name")
	}
	name := meta.GetName()
	switch o := obj.(type) {
	case *appsv1.Deployment:
		m.deployments[name] = o
	case *appsv1.StatefulSet:
		m.statefulSets[name] = o
	case *corev1.Service:
		m.services[name] = o
	case *corev1.ConfigMap:
		m.configMaps[name] = o
	case *corev1.Secret:
		m.secrets[name] = o
	case *policyv1.PodDisruptionBudget:
		m.pdbs[name] = o
	case *corev1.Namespace:
		m.namespaces[name] = o
	case *corev1.ServiceAccount:
		m.serviceAccounts[name] = o
	case *rbacv1.Role:
		m.roles[name] = o
	case *rbacv1.RoleBinding:
		m.roleBindings[name] = o
	case *nodev1.RuntimeClass:
		m.runtimeClasses[name] = o
	default:
		return errors.New("no test checks a " + gvk.String() + ": add it here")
	}
	return nil
}

// load decodes every document of every *.yaml file in dirs (this directory when none), in order:
// an object of a later directory replaces one of the same kind and name of an earlier one, as
// agent-sandbox/'s ConfigMap and Deployment replace this directory's.
func load(t *testing.T, dirs ...string) *manifests {
	t.Helper()
	m := &manifests{
		deployments: map[string]*appsv1.Deployment{}, statefulSets: map[string]*appsv1.StatefulSet{},
		services: map[string]*corev1.Service{}, configMaps: map[string]*corev1.ConfigMap{},
		secrets: map[string]*corev1.Secret{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		namespaces: map[string]*corev1.Namespace{}, serviceAccounts: map[string]*corev1.ServiceAccount{},
		roles: map[string]*rbacv1.Role{}, roleBindings: map[string]*rbacv1.RoleBinding{},
		runtimeClasses: map[string]*nodev1.RuntimeClass{}, custom: map[string]map[string]map[string]any{},
	}
	if len(dirs) == 0 {
		dirs = []string{"."}
	}
	var files []string
	for _, dir := range dirs {
		in, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
		if err != nil || len(in) == 0 {
			t.Fatalf("no manifests in %s (%v)", dir, err)
		}
		files = append(files, in...)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for i := 0; ; i++ {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: document %d: %v", f, i, err)
			}
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue
			}
			if err := decodeStrict(m, doc); err != nil {
				t.Errorf("%s: document %d: %v", f, i, err)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return m
}

// decodeCustom keeps a document of one of agent-sandbox's API groups as a JSON object, strictly
// decoded (a duplicate key fails); custom reports whether doc was one.
func decodeCustom(m *manifests, doc []byte) (custom bool, err error) {
	var head metav1.TypeMeta
	if err := sigsyaml.Unmarshal(doc, &head); err != nil {
		return false, nil // the API machinery's decoder says what is wrong
	}
	group, _, _ := strings.Cut(head.APIVersion, "/")
	if group != "agents.x-k8s.io" && group != "extensions.agents.x-k8s.io" {
		return false, nil
	}
	var obj map[string]any
	if err := sigsyaml.UnmarshalStrict(doc, &obj); err != nil {
		return true, err
	}
	meta, _ := obj["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	if name == "" {
		return true, errors.New(head.Kind + " without metadata.name")
	}
	if m.custom[head.Kind] == nil {
		m.custom[head.Kind] = map[string]map[string]any{}
	}
	m.custom[head.Kind][name] = obj
	return true, nil
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(append(out, l...), '\n')
		}
	}
	return out
}

// proxy returns the proxy's Deployment and its container.
func (m *manifests) proxy(t *testing.T) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	d := m.deployments["ciproxy"]
	if d == nil {
		t.Fatal("no Deployment ciproxy")
	}
	for i, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "proxy" {
			return d, &d.Spec.Template.Spec.Containers[i]
		}
	}
	t.Fatal("the Deployment has no container proxy")
	return nil, nil
}

// proxyConfig parses the ConfigMap's config.yaml with the proxy's own loader and every sandbox
// backend, resolving os.environ/ references from what the container's environment holds (the
// Secret's keys and its env entries): a reference the pod does not provide is a warning.
func (m *manifests) proxyConfig(t *testing.T, c *corev1.Container, d *appsv1.Deployment) *config.Config {
	t.Helper()
	vol := volume(d.Spec.Template.Spec, configMount, c)
	if vol == nil || vol.ConfigMap == nil {
		t.Fatalf("%s is not mounted from a ConfigMap", configMount)
	}
	cm := m.configMaps[vol.ConfigMap.Name]
	if cm == nil {
		t.Fatalf("no ConfigMap %s", vol.ConfigMap.Name)
	}
	data, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatalf("ConfigMap %s has no config.yaml", cm.Name)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = "set"
	}
	env["CIPROXY_ADVERTISE_URL"] = "http://10.0.0.1:4000" // the value $(POD_IP) expands to
	for _, from := range c.EnvFrom {
		s := m.secrets[from.SecretRef.Name]
		if s == nil {
			t.Fatalf("envFrom names Secret %s, which is not here", from.SecretRef.Name)
		}
		for k, v := range s.StringData {
			env[k] = v
		}
	}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	cfg, err := config.ParseWith([]byte(data), "configmap.yaml", backends.ParseOptions(lookup))
	if err != nil {
		t.Fatalf("the ConfigMap's config.yaml: %v", err)
	}
	for _, w := range cfg.Warnings {
		t.Errorf("the ConfigMap's config.yaml: warning: %s", w)
	}
	return cfg
}

// volume returns the pod volume mounted at path in c, or nil.
func volume(spec corev1.PodSpec, path string, c *corev1.Container) *corev1.Volume {
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != path {
			continue
		}
		for i, v := range spec.Volumes {
			if v.Name == vm.Name {
				return &spec.Volumes[i]
			}
		}
	}
	return nil
}

func TestProxyPodSecurity(t *testing.T) {
	m := load(t)
	d, c := m.proxy(t)
	pod := d.Spec.Template.Spec
	psc := pod.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	csc := c.SecurityContext
	if csc == nil {
		t.Fatal("the proxy container has no securityContext")
	}
	// What the kubelet applies: the container's setting, else the pod's.
	runAsNonRoot, runAsUser, seccomp := psc.RunAsNonRoot, psc.RunAsUser, psc.SeccompProfile
	if csc.RunAsNonRoot != nil {
		runAsNonRoot = csc.RunAsNonRoot
	}
	if csc.RunAsUser != nil {
		runAsUser = csc.RunAsUser
	}
	if csc.SeccompProfile != nil {
		seccomp = csc.SeccompProfile
	}
	if runAsNonRoot == nil || !*runAsNonRoot {
		t.Error("runAsNonRoot is not true")
	}
	// Without a numeric uid the kubelet cannot verify runAsNonRoot for an image whose USER is a
	// name, and refuses the pod (CreateContainerConfigError).
	if runAsUser == nil || *runAsUser != imageUID {
		t.Errorf("runAsUser = %v; want %d, the image's user", runAsUser, imageUID)
	}
	if csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation is not false")
	}
	if csc.Privileged != nil && *csc.Privileged {
		t.Error("the proxy container is privileged")
	}
	if csc.Capabilities == nil || !slices.Equal(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("capabilities.drop = %v; want [ALL]", csc.Capabilities)
	} else if add := csc.Capabilities.Add; !slices.Equal(add, addedCapabilities[c.Name]) {
		t.Errorf("capabilities.add = %v; want %v (say why in docs/deploy.md)", add, addedCapabilities[c.Name])
	}
	if csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem is not true")
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeLocalhost ||
		seccomp.LocalhostProfile == nil || *seccomp.LocalhostProfile != seccompProfile {
		t.Errorf("seccompProfile = %+v; want Localhost %s (deploy/seccomp.json)", seccomp, seccompProfile)
	}
	// The API server refuses procMount Unmasked in a pod that shares the host's user namespace.
	if csc.ProcMount != nil && *csc.ProcMount == corev1.UnmaskedProcMount &&
		(pod.HostUsers == nil || *pod.HostUsers) {
		t.Error("procMount Unmasked needs hostUsers: false")
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Error("the pod shares a host namespace")
	}
}

func TestProxyPodVolumes(t *testing.T) {
	m := load(t)
	d, c := m.proxy(t)
	pod := d.Spec.Template.Spec
	// The root file system is read-only: what the proxy writes needs a writable volume.
	for _, path := range []string{dataDir, "/tmp"} {
		v := volume(pod, path, c)
		if v == nil {
			t.Errorf("no volume at %s", path)
			continue
		}
		if v.EmptyDir == nil && v.PersistentVolumeClaim == nil {
			t.Errorf("the volume at %s is not writable storage: %+v", path, v.VolumeSource)
		}
		for _, vm := range c.VolumeMounts {
			if vm.MountPath == path && vm.ReadOnly {
				t.Errorf("%s is mounted read-only", path)
			}
		}
	}
	// A subPath mount never sees the kubelet's symlink swap: the config would not reload.
	for _, vm := range c.VolumeMounts {
		if vm.MountPath == configMount && vm.SubPath != "" {
			t.Errorf("%s is mounted with subPath %q: ConfigMap updates would not reach it", configMount, vm.SubPath)
		}
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--config " + configMount + "/config.yaml", "--data-dir " + dataDir} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
	cfg := m.proxyConfig(t, c, d)
	for _, tool := range cfg.SandboxTools {
		if o, ok := tool.Settings.(local.Options); ok && !strings.HasPrefix(o.WorkDir, "/tmp/") && !strings.HasPrefix(o.WorkDir, dataDir+"/") {
			t.Errorf("sandbox tool %s: work_dir %s is not on a writable volume", tool.Name, o.WorkDir)
		}
	}
}

func TestProxyPodProbesAndGrace(t *testing.T) {
	m := load(t)
	d, c := m.proxy(t)
	ports := map[string]bool{}
	for _, p := range c.Ports {
		ports[p.Name] = true
	}
	for _, tc := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"readinessProbe", c.ReadinessProbe, "/readyz"},
		{"livenessProbe", c.LivenessProbe, "/healthz"},
	} {
		switch {
		case tc.probe == nil || tc.probe.HTTPGet == nil:
			t.Errorf("%s is not an httpGet probe", tc.name)
		case tc.probe.HTTPGet.Path != tc.path:
			t.Errorf("%s path = %s; want %s", tc.name, tc.probe.HTTPGet.Path, tc.path)
		case !ports[tc.probe.HTTPGet.Port.String()]:
			t.Errorf("%s port %s is not a port of the container", tc.name, tc.probe.HTTPGet.Port.String())
		}
	}
	cfg := m.proxyConfig(t, c, d)
	grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil {
		t.Fatal("no terminationGracePeriodSeconds (the default 30s is not longer than the default shutdown_grace)")
	}
	if got, need := time.Duration(*grace)*time.Second, cfg.General.ShutdownGrace+unwind; got <= need {
		t.Errorf("terminationGracePeriodSeconds %s is not longer than shutdown_grace %s plus the unwind %s",
			got, cfg.General.ShutdownGrace, unwind)
	}
}

func TestSelectors(t *testing.T) {
	m := load(t)
	d, _ := m.proxy(t)
	podLabels := labels.Set(d.Spec.Template.Labels)
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(podLabels) {
		t.Errorf("the Deployment's selector %v does not select its own pods (%v)", d.Spec.Selector, err)
	}
	pdb := m.pdbs["ciproxy"]
	if pdb == nil {
		t.Fatal("no PodDisruptionBudget ciproxy")
	}
	if psel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || psel.Empty() || !psel.Matches(podLabels) {
		t.Errorf("the PodDisruptionBudget's selector %v does not select the proxy's pods (%v)", pdb.Spec.Selector, err)
	}
	if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
		t.Error("the PodDisruptionBudget bounds nothing")
	}
	svc := m.services["ciproxy"]
	if svc == nil {
		t.Fatal("no Service ciproxy")
	}
	if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("the Service's selector %v does not select the proxy's pods %v", svc.Spec.Selector, podLabels)
	}

	// Redis: the Service the config names selects the StatefulSet's pods, and only those.
	_, c := m.proxy(t)
	cfg := m.proxyConfig(t, c, d)
	rsvc := m.services[cfg.Router.Redis.Host]
	if rsvc == nil {
		t.Fatalf("the config's redis_host %q is no Service here", cfg.Router.Redis.Host)
	}
	rs := m.statefulSets[rsvc.Name]
	if rs == nil {
		t.Fatalf("no StatefulSet %s", rsvc.Name)
	}
	rsel := labels.SelectorFromSet(rsvc.Spec.Selector)
	if len(rsvc.Spec.Selector) == 0 || !rsel.Matches(labels.Set(rs.Spec.Template.Labels)) {
		t.Errorf("Service %s does not select the Redis pods", rsvc.Name)
	}
	if rsel.Matches(podLabels) || labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(rs.Spec.Template.Labels)) {
		t.Error("the proxy's and Redis's Services select each other's pods")
	}
}
