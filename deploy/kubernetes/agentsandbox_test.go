package kubernetes_test

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandbox"
	"github.com/ciproxy/ciproxy/internal/sandbox/agentsandboxtest"
)

// agentSandboxDir holds the manifests of the agent-sandbox deployment; they replace this
// directory's ConfigMap and Deployment and use the rest.
const agentSandboxDir = "agent-sandbox"

// strictJSON decodes v's JSON form into out, refusing unknown fields: how a part of a custom
// resource that is a Kubernetes type (a PodSpec, a NetworkPolicy rule) is checked as strictly as
// a whole object is.
func strictJSON(t *testing.T, v any, out any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
}

// field walks obj along path, failing the test when a step is missing.
func field(t *testing.T, obj map[string]any, path ...string) any {
	t.Helper()
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			t.Fatalf("%v: no %s", path, p)
		}
		if cur, ok = m[p]; !ok {
			t.Fatalf("%v: no %s", path, p)
		}
	}
	return cur
}

// sandboxTemplate returns the one SandboxTemplate, its pod spec and its network policy.
func (m *manifests) sandboxTemplate(t *testing.T) (map[string]any, corev1.PodSpec, networkingv1.NetworkPolicySpec) {
	t.Helper()
	if len(m.custom["SandboxTemplate"]) != 1 {
		t.Fatalf("%d SandboxTemplates; want 1", len(m.custom["SandboxTemplate"]))
	}
	var tmpl map[string]any
	for _, v := range m.custom["SandboxTemplate"] {
		tmpl = v
	}
	var pod corev1.PodSpec
	strictJSON(t, field(t, tmpl, "spec", "podTemplate", "spec"), &pod)
	var np networkingv1.NetworkPolicySpec
	strictJSON(t, field(t, tmpl, "spec", "networkPolicy"), &np)
	return tmpl, pod, np
}

func TestAgentSandboxRBAC(t *testing.T) {
	m := load(t, ".", agentSandboxDir)
	d, _ := m.proxy(t)
	pod := d.Spec.Template.Spec
	if pod.ServiceAccountName == "" || pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Fatalf("the proxy's pod runs as %q with automount %v; want its service account's token mounted (in-cluster credentials)",
			pod.ServiceAccountName, pod.AutomountServiceAccountToken)
	}
	proxyNS := d.Namespace
	if proxyNS == "" {
		proxyNS = "default"
	}
	sa := m.serviceAccounts[pod.ServiceAccountName]
	if sa == nil || sa.Namespace != proxyNS {
		t.Fatalf("ServiceAccount %s in %s: %+v", pod.ServiceAccountName, proxyNS, sa)
	}
	tmpl, _, _ := m.sandboxTemplate(t)
	ns := field(t, tmpl, "metadata", "namespace").(string)
	if m.namespaces[ns] == nil {
		t.Errorf("the sandboxes' namespace %s is not made here", ns)
	}
	// Exactly what the backend calls, nothing on pods or secrets.
	want := map[string][]string{
		"extensions.agents.x-k8s.io/sandboxclaims":    {"create", "delete", "get", "list", "patch", "watch"},
		"extensions.agents.x-k8s.io/sandboxwarmpools": {"get"},
		"agents.x-k8s.io/sandboxes":                   {"get", "list", "watch"},
	}
	var bound bool
	for _, rb := range m.roleBindings {
		if rb.Namespace != ns || rb.RoleRef.Kind != "Role" {
			continue
		}
		for _, s := range rb.Subjects {
			if s.Kind != "ServiceAccount" || s.Name != sa.Name || s.Namespace != sa.Namespace {
				continue
			}
			bound = true
			role := m.roles[rb.RoleRef.Name]
			if role == nil || role.Namespace != ns {
				t.Fatalf("RoleBinding %s names Role %s, not in %s", rb.Name, rb.RoleRef.Name, ns)
			}
			got := map[string][]string{}
			for _, r := range role.Rules {
				for _, g := range r.APIGroups {
					for _, res := range r.Resources {
						got[g+"/"+res] = append(got[g+"/"+res], r.Verbs...)
					}
				}
			}
			for k := range got {
				slices.Sort(got[k])
			}
			if !maps.EqualFunc(got, want, slices.Equal) {
				t.Errorf("Role %s grants %v; want exactly %v", role.Name, got, want)
			}
		}
	}
	if !bound {
		t.Errorf("no RoleBinding in %s binds ServiceAccount %s/%s", ns, sa.Namespace, sa.Name)
	}
}

func TestAgentSandboxTemplate(t *testing.T) {
	m := load(t, ".", agentSandboxDir)
	d, _ := m.proxy(t)
	tmpl, pod, np := m.sandboxTemplate(t)
	if pod.RuntimeClassName == nil || m.runtimeClasses[*pod.RuntimeClassName] == nil {
		t.Errorf("the sandboxes' runtimeClassName %v is not a RuntimeClass made here", pod.RuntimeClassName)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("a sandbox must not get a service account token: the code in it is hostile")
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers; want sandboxd's alone (commands run in its container)", len(pod.Containers))
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("the sandbox container's securityContext %+v; want no privilege escalation and every capability dropped", sc)
	}
	if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("the sandbox pod's securityContext %+v; want a numeric non-root user", pod.SecurityContext)
	}
	if volume(pod, "/mnt/data", &c) == nil {
		t.Error("/mnt/data is not a volume: with a read-only root the code could not write its files")
	}
	if c.Resources.Limits.Memory().IsZero() || c.Resources.Limits.Cpu().IsZero() {
		t.Errorf("the sandbox container's limits %v; want memory and cpu bounded", c.Resources.Limits)
	}

	// The NetworkPolicy: no egress at all (an empty list, not an absent one, which agent-sandbox
	// would replace by its default that opens the internet), and ingress from the proxy's pods
	// alone, on sandboxd's two ports.
	if field(t, tmpl, "spec", "networkPolicyManagement") != "Managed" {
		t.Error("networkPolicyManagement is not Managed: the rules would not be applied")
	}
	if eg, ok := field(t, tmpl, "spec", "networkPolicy").(map[string]any)["egress"].([]any); !ok || len(eg) != 0 {
		t.Errorf("networkPolicy.egress = %v; want an empty list (no egress)", field(t, tmpl, "spec", "networkPolicy"))
	}
	proxyNS := d.Namespace
	if proxyNS == "" {
		proxyNS = "default"
	}
	proxyPod := labels.Set(d.Spec.Template.Labels)
	nsLabels := labels.Set{"kubernetes.io/metadata.name": proxyNS}
	admitted := map[int32]bool{}
	for _, rule := range np.Ingress {
		for _, peer := range rule.From {
			if peer.IPBlock != nil || peer.PodSelector == nil || peer.NamespaceSelector == nil {
				t.Errorf("ingress peer %+v: want the proxy's pods by pod and namespace selector, nothing wider", peer)
				continue
			}
			ps, err1 := metav1.LabelSelectorAsSelector(peer.PodSelector)
			nss, err2 := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
			if err1 != nil || err2 != nil || ps.Empty() || !ps.Matches(proxyPod) || !nss.Matches(nsLabels) {
				t.Errorf("ingress peer %+v does not select the proxy's pods %v in %s", peer, proxyPod, proxyNS)
				continue
			}
			for _, p := range rule.Ports {
				if p.Port != nil && p.Port.Type == intstr.Int {
					admitted[p.Port.IntVal] = true
				}
			}
		}
	}
	for _, port := range []int32{9090, 8080} {
		if !admitted[port] {
			t.Errorf("the proxy's pods are not admitted on port %d (admitted: %v)", port, admitted)
		}
	}
	if len(admitted) != 2 {
		t.Errorf("admitted ports %v; want sandboxd's two only", admitted)
	}
	var ports []int32
	for _, p := range c.Ports {
		ports = append(ports, p.ContainerPort)
	}
	slices.Sort(ports)
	if !slices.Equal(ports, []int32{8080, 9090}) {
		t.Errorf("the sandbox container's ports %v; want sandboxd's 8080 and 9090", ports)
	}

	pools := m.custom["SandboxWarmPool"]
	if len(pools) != 1 {
		t.Fatalf("%d SandboxWarmPools; want 1", len(pools))
	}
	for name, pool := range pools {
		if field(t, pool, "spec", "sandboxTemplateRef", "name") != field(t, tmpl, "metadata", "name") {
			t.Errorf("SandboxWarmPool %s does not use the template", name)
		}
		if field(t, pool, "metadata", "namespace") != field(t, tmpl, "metadata", "namespace") {
			t.Errorf("SandboxWarmPool %s is not in the template's namespace", name)
		}
	}
}

// TestAgentSandboxConfigMap checks that the proxy's configuration names the warm pool of
// sandboxes.yaml, in its namespace, with the ports the template's sandboxd listens on.
func TestAgentSandboxConfigMap(t *testing.T) {
	m := load(t, ".", agentSandboxDir)
	d, c := m.proxy(t)
	cfg := m.proxyConfig(t, c, d)
	var s *agentsandbox.Settings
	for _, tool := range cfg.SandboxTools {
		if tool.Backend == agentsandbox.Backend {
			v := tool.Settings.(agentsandbox.Settings)
			s = &v
		}
	}
	if s == nil {
		t.Fatal("the ConfigMap has no agent_sandbox tool")
	}
	pool, ok := m.custom["SandboxWarmPool"][s.WarmPool]
	if !ok {
		t.Fatalf("the tool's warm_pool %q is not a SandboxWarmPool here", s.WarmPool)
	}
	if ns := field(t, pool, "metadata", "namespace"); ns != s.Namespace {
		t.Errorf("the tool's namespace %q; the pool is in %v", s.Namespace, ns)
	}
	if s.ProcessPort != 9090 || s.FilesPort != 8080 || s.Connect != agentsandbox.ConnectPodIP || s.Kubeconfig != "" {
		t.Errorf("the tool's settings %+v; want sandboxd's ports at the pod IP, in-cluster credentials", s.Options)
	}
	if _, ok := m.roles["ciproxy-sandboxes"]; !ok || m.roles["ciproxy-sandboxes"].Namespace != s.Namespace {
		t.Errorf("the RBAC Role is not in the tool's namespace %q", s.Namespace)
	}
}

// TestAgentSandboxCRDs validates the SandboxTemplate and SandboxWarmPool against agent-sandbox's
// own CRD schemas, as the API server would on kubectl apply (strict: an unknown field fails).
func TestAgentSandboxCRDs(t *testing.T) {
	m := load(t, ".", agentSandboxDir)
	n := 0
	for _, kind := range []string{"SandboxTemplate", "SandboxWarmPool"} {
		for name, obj := range m.custom[kind] {
			n++
			u := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(obj)}
			if err := agentsandboxtest.Validate(u); err != nil {
				t.Errorf("%s %s: %v", kind, name, err)
			}
		}
	}
	if n != 2 {
		t.Errorf("validated %d objects; want the template and the pool", n)
	}
	// The check has teeth: a misspelt field and a bad enum fail.
	for _, tc := range []struct {
		name string
		edit func(map[string]any)
	}{
		{"unknown field", func(o map[string]any) { o["spec"].(map[string]any)["replica"] = int64(2) }},
		{"bad enum", func(o map[string]any) {
			o["spec"].(map[string]any)["updateStrategy"] = map[string]any{"type": "Sometimes"}
		}},
	} {
		for name, obj := range m.custom["SandboxWarmPool"] {
			u := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(obj)}
			tc.edit(u.Object)
			if err := agentsandboxtest.Validate(u); err == nil {
				t.Errorf("%s: SandboxWarmPool %s validated", tc.name, name)
			}
		}
	}
}
