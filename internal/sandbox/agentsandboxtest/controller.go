package agentsandboxtest

import (
	"fmt"
	"reflect"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/watch"
)

// Labels and annotations the controllers set [upstream api/v1beta1, extensions/api/v1beta1].
const (
	warmPoolLabel        = "agents.x-k8s.io/warm-pool-sandbox"
	sandboxNameAnno      = "agents.x-k8s.io/sandbox-name"
	launchTypeAnno       = "agents.x-k8s.io/launch-type"
	reconcileEvery       = 25 * time.Millisecond
	conditionReady       = "Ready"
	reasonReady          = "DependenciesReady"
	reasonNotReady       = "DependenciesNotReady"
	reasonPodFailed      = "PodFailed"
	reasonExpired        = "SandboxExpired"
	reasonSuspended      = "SandboxSuspended"
	reasonReconcilerErr  = "ReconcilerError"
	reasonClaimExpired   = "ClaimExpired"
	reasonSandboxMissing = "SandboxMissing"
	reasonNotReadyClaim  = "SandboxNotReady"
)

// podState is the controller's view of a Sandbox's pod.
type podState struct {
	pod     *pod
	err     error
	readyAt time.Time
	ready   bool // has been Ready: HoldReadiness no longer applies
	failed  bool // KillPod, or its processes died: PodFailed, no new pod
	stopped bool // a failed pod's servers were stopped
}

func (p *podState) stop() {
	if p.pod != nil {
		p.pod.stop()
	}
}

// loop runs the controllers: a pass after every change and every reconcileEvery (for delays
// and shutdown times).
func (s *Server) loop() {
	defer close(s.loopDone)
	t := time.NewTicker(reconcileEvery)
	defer t.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-s.kickCh:
		case <-t.C:
		}
		s.mu.Lock()
		s.reconcile()
		s.passes++
		s.mu.Unlock()
	}
}

func (s *Server) reconcile() {
	now := s.now()
	s.reconcileSandboxes(now)
	s.reconcilePools()
	s.reconcileClaims(now)
}

// sorted returns a resource's objects in name order (the originals: copy before changing).
func (s *Server) sorted(res string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range s.st.objects[res] {
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out
}

func parseTime(obj *unstructured.Unstructured, path ...string) (time.Time, bool) {
	v, ok, _ := unstructured.NestedString(obj.Object, path...)
	if !ok || v == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339, v)
	return t, err == nil
}

// setReady returns conds with the Ready condition set, keeping its transition time when the
// status is unchanged.
func setReady(conds []any, status, reason, msg string, gen int64, now time.Time) []any {
	c := map[string]any{"type": conditionReady, "status": status, "reason": reason, "message": msg,
		"observedGeneration": gen, "lastTransitionTime": now.UTC().Format(time.RFC3339)}
	var out []any
	found := false
	for _, x := range conds {
		m, _ := x.(map[string]any)
		if m != nil && m["type"] == conditionReady {
			found = true
			if m["status"] == status {
				c["lastTransitionTime"] = m["lastTransitionTime"]
			}
			out = append(out, c)
			continue
		}
		out = append(out, x)
	}
	if !found {
		out = append(out, c)
	}
	return out
}

func readyCondition(obj *unstructured.Unstructured) map[string]any {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, x := range conds {
		if m, ok := x.(map[string]any); ok && m["type"] == conditionReady {
			return m
		}
	}
	return nil
}

func isReady(obj *unstructured.Unstructured) bool {
	c := readyCondition(obj)
	return c != nil && c["status"] == "True"
}

// updateStatus stores obj's new status when it differs from cur's.
func (s *Server) updateStatus(kind string, cur *unstructured.Unstructured, status map[string]any) {
	old, _, _ := unstructured.NestedMap(cur.Object, "status")
	if reflect.DeepEqual(normalize(old), normalize(status)) {
		return
	}
	next := cur.DeepCopy()
	next.Object["status"] = status
	s.put(mustResource(kind), next, watch.Modified)
}

// normalize makes int and int64 compare equal.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := map[string]any{}
		for k, e := range x {
			m[k] = normalize(e)
		}
		return m
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	case int:
		return int64(x)
	case float64:
		return int64(x)
	}
	return v
}

// stopPod forgets a Sandbox's pod and kills it in the background. The caller holds s.mu.
func (s *Server) stopPod(name string) {
	ps := s.pods[name]
	if ps == nil {
		return
	}
	delete(s.pods, name)
	s.podWG.Add(1)
	go func() {
		defer s.podWG.Done()
		ps.stop()
		if ps.pod != nil {
			s.mu.Lock()
			delete(s.ipTaken, ps.pod.ip)
			s.mu.Unlock()
		}
	}()
}

// containerEnv is the env of the podTemplate's first container (literal values only).
func containerEnv(sb *unstructured.Unstructured) map[string]string {
	cs, _, _ := unstructured.NestedSlice(sb.Object, "spec", "podTemplate", "spec", "containers")
	env := map[string]string{}
	if len(cs) == 0 {
		return env
	}
	c, _ := cs[0].(map[string]any)
	list, _ := c["env"].([]any)
	for _, e := range list {
		m, _ := e.(map[string]any)
		if n, ok := m["name"].(string); ok {
			v, _ := m["value"].(string)
			env[n] = v
		}
	}
	return env
}

// reconcileSandboxes is the core controller: a pod per running Sandbox, its status, expiry.
func (s *Server) reconcileSandboxes(now time.Time) {
	for _, sb := range s.sorted("sandboxes") {
		name := sb.GetName()
		gen := sb.GetGeneration()
		conds, _, _ := unstructured.NestedSlice(sb.Object, "status", "conditions")
		status := map[string]any{"selector": "agents.x-k8s.io/sandbox-name-hash=" + name}
		if t, ok := parseTime(sb, "spec", "shutdownTime"); ok && !now.Before(t) {
			s.stopPod(name)
			if p, _, _ := unstructured.NestedString(sb.Object, "spec", "shutdownPolicy"); p == "Delete" {
				s.remove(mustResource("Sandbox"), sb.GetNamespace(), name)
				continue
			}
			status["conditions"] = setReady(conds, "False", reasonExpired, "Sandbox has expired", gen, now)
			s.updateStatus("Sandbox", sb, status)
			continue
		}
		if m, _, _ := unstructured.NestedString(sb.Object, "spec", "operatingMode"); m == "Suspended" {
			s.stopPod(name)
			status["conditions"] = setReady(conds, "False", reasonSuspended, "Sandbox is suspended", gen, now)
			s.updateStatus("Sandbox", sb, status)
			continue
		}
		ps := s.pods[name]
		if ps == nil {
			ps = &podState{}
			s.pods[name] = ps
			s.podWG.Add(1)
			go s.launchPod(name, ps, containerEnv(sb))
		}
		if ps.pod != nil && !ps.pod.alive() {
			ps.failed = true
		}
		switch {
		case ps.failed:
			status["conditions"] = setReady(conds, "False", reasonPodFailed, "Pod has failed", gen, now)
		case ps.err != nil:
			status["conditions"] = setReady(conds, "False", reasonReconcilerErr, "Error seen: "+ps.err.Error(), gen, now)
		case ps.pod == nil:
			status["conditions"] = setReady(conds, "False", reasonNotReady, "Pod does not exist", gen, now)
		case !ps.ready && (s.holdReadiness || now.Before(ps.readyAt)):
			status["podIPs"] = []any{ps.pod.ip}
			status["conditions"] = setReady(conds, "False", reasonNotReady, "Pod exists with phase: Running; Pod is not Ready", gen, now)
		default:
			ps.ready = true
			status["podIPs"] = []any{ps.pod.ip}
			status["conditions"] = setReady(conds, "True", reasonReady, "Pod is Ready; Service Exists", gen, now)
		}
		if ps.failed {
			// A failed pod keeps no processes and no address.
			s.stopPodProcesses(ps)
		}
		s.updateStatus("Sandbox", sb, status)
	}
}

// stopPodProcesses stops a failed pod's servers once; the state stays so no new pod is made.
func (s *Server) stopPodProcesses(ps *podState) {
	if ps.pod == nil || ps.stopped {
		return
	}
	ps.stopped = true
	p := ps.pod
	s.podWG.Add(1)
	go func() {
		defer s.podWG.Done()
		p.stop()
	}()
}

// launchPod starts a Sandbox's pod off the controller's lock.
func (s *Server) launchPod(name string, ps *podState, env map[string]string) {
	defer s.podWG.Done()
	p, err := s.startPod(name, env)
	s.mu.Lock()
	if s.pods[name] != ps || s.closed {
		s.mu.Unlock()
		if p != nil {
			p.stop()
			s.mu.Lock()
			delete(s.ipTaken, p.ip)
			s.mu.Unlock()
		}
		return
	}
	ps.pod, ps.err = p, err
	ps.readyAt = s.now().Add(s.opts.ReadyDelay)
	s.mu.Unlock()
	s.kick()
}

// reconcilePools keeps each pool's unclaimed Sandboxes at spec.replicas.
func (s *Server) reconcilePools() {
	for _, pool := range s.sorted("sandboxwarmpools") {
		want, _, _ := unstructured.NestedInt64(pool.Object, "spec", "replicas")
		tmplName, _, _ := unstructured.NestedString(pool.Object, "spec", "sandboxTemplateRef", "name")
		tmpl := s.st.objects["sandboxtemplates"][key(pool.GetNamespace(), tmplName)]
		var mine []*unstructured.Unstructured
		ready := 0
		for _, sb := range s.sorted("sandboxes") {
			if sb.GetNamespace() == pool.GetNamespace() && sb.GetLabels()[warmPoolLabel] == pool.GetName() {
				mine = append(mine, sb)
				if isReady(sb) {
					ready++
				}
			}
		}
		for i := int64(len(mine)); i < want && tmpl != nil; i++ {
			sb := s.sandboxFrom(tmpl, pool.GetName()+"-"+rand.String(5), pool, nil)
			sb.SetLabels(map[string]string{warmPoolLabel: pool.GetName()})
			if _, err := s.createLocked(mustResource("Sandbox"), sb); err != nil {
				break
			}
		}
		for i := int64(len(mine)); i > want; i-- {
			s.remove(mustResource("Sandbox"), pool.GetNamespace(), mine[i-1].GetName())
		}
		s.updateStatus("SandboxWarmPool", pool, map[string]any{
			"replicas": int64(min(int64(len(mine)), want)), "readyReplicas": int64(ready),
			"selector": warmPoolLabel + "=" + pool.GetName(), "observedGeneration": pool.GetGeneration()})
	}
}

func ownerRef(o *unstructured.Unstructured) metav1.OwnerReference {
	t := true
	return metav1.OwnerReference{APIVersion: o.GetAPIVersion(), Kind: o.GetKind(), Name: o.GetName(), UID: o.GetUID(),
		Controller: &t, BlockOwnerDeletion: &t}
}

// sandboxFrom builds a Sandbox of a template, owned by owner, with env added to its containers.
func (s *Server) sandboxFrom(tmpl *unstructured.Unstructured, name string, owner *unstructured.Unstructured, env []any) *unstructured.Unstructured {
	spec := map[string]any{}
	if pt, ok, _ := unstructured.NestedMap(tmpl.Object, "spec", "podTemplate"); ok {
		spec["podTemplate"] = pt
	}
	if v, ok, _ := unstructured.NestedSlice(tmpl.Object, "spec", "volumeClaimTemplates"); ok {
		spec["volumeClaimTemplates"] = v
	}
	if len(env) > 0 {
		cs, _, _ := unstructured.NestedSlice(spec, "podTemplate", "spec", "containers")
		for i, c := range cs {
			cm, _ := c.(map[string]any)
			cur, _ := cm["env"].([]any)
			for _, e := range env {
				em, _ := e.(map[string]any)
				if cn, _ := em["containerName"].(string); cn != "" && cn != cm["name"] {
					continue
				}
				cur = append(cur, map[string]any{"name": em["name"], "value": em["value"]})
			}
			cm["env"] = cur
			cs[i] = cm
		}
		_ = unstructured.SetNestedSlice(spec, cs, "podTemplate", "spec", "containers")
	}
	sb := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
		"metadata": map[string]any{"name": name, "namespace": tmpl.GetNamespace()},
		"spec":     spec,
	}}
	sb.SetOwnerReferences([]metav1.OwnerReference{ownerRef(owner)})
	return sb
}

// reconcileClaims assigns sandboxes to claims (adoption from the pool, or a cold start), mirrors
// their readiness and enforces the claims' lifecycle.
func (s *Server) reconcileClaims(now time.Time) {
	for _, claim := range s.sorted("sandboxclaims") {
		ns, gen := claim.GetNamespace(), claim.GetGeneration()
		conds, _, _ := unstructured.NestedSlice(claim.Object, "status", "conditions")
		assigned := claim.GetAnnotations()[sandboxNameAnno]
		if t, ok := parseTime(claim, "spec", "lifecycle", "shutdownTime"); ok && !now.Before(t) {
			if assigned != "" {
				if sb := s.st.objects["sandboxes"][key(ns, assigned)]; sb != nil && ownedBy(sb, claim) {
					s.remove(mustResource("Sandbox"), ns, assigned)
				}
			}
			if p, _, _ := unstructured.NestedString(claim.Object, "spec", "lifecycle", "shutdownPolicy"); p == "Delete" || p == "DeleteForeground" {
				s.remove(mustResource("SandboxClaim"), ns, claim.GetName())
				continue
			}
			s.updateStatus("SandboxClaim", claim, map[string]any{
				"conditions": setReady(conds, "False", reasonClaimExpired, "Claim expired. Sandbox cleanup initiated.", gen, now)})
			continue
		}
		if assigned == "" {
			if s.stallClaims {
				continue
			}
			name, reason, msg := s.assign(claim)
			if name == "" {
				s.updateStatus("SandboxClaim", claim, map[string]any{"conditions": setReady(conds, "False", reason, msg, gen, now)})
				continue
			}
			next := claim.DeepCopy()
			ann := next.GetAnnotations()
			if ann == nil {
				ann = map[string]string{}
			}
			ann[sandboxNameAnno] = name
			next.SetAnnotations(ann)
			claim = s.put(mustResource("SandboxClaim"), next, watch.Modified)
			assigned = name
		}
		sb := s.st.objects["sandboxes"][key(ns, assigned)]
		status := map[string]any{}
		switch {
		case sb == nil:
			status["conditions"] = setReady(conds, "False", reasonSandboxMissing, "Sandbox does not exist", gen, now)
		default:
			sbStatus := map[string]any{"name": assigned}
			if ips, ok, _ := unstructured.NestedSlice(sb.Object, "status", "podIPs"); ok {
				sbStatus["podIPs"] = ips
			}
			status["sandbox"] = sbStatus
			c := readyCondition(sb)
			switch {
			case c != nil && c["reason"] == reasonExpired:
				status["conditions"] = setReady(conds, "False", reasonExpired, "Underlying Sandbox resource has expired independently of the Claim.", gen, now)
			case c != nil:
				st, _ := c["status"].(string)
				r, _ := c["reason"].(string)
				m, _ := c["message"].(string)
				status["conditions"] = setReady(conds, st, r, m, gen, now)
			default:
				status["conditions"] = setReady(conds, "False", reasonNotReadyClaim, "Sandbox is not ready", gen, now)
			}
		}
		s.updateStatus("SandboxClaim", claim, status)
	}
}

func ownedBy(o, owner *unstructured.Unstructured) bool {
	for _, r := range o.GetOwnerReferences() {
		if r.UID == owner.GetUID() {
			return true
		}
	}
	return false
}

// assign gives a claim a Sandbox: a ready one adopted from its pool, or (with env, volume claim
// templates, or an empty pool) a new one from the pool's template. It returns the Sandbox's
// name, or a reason and message why there is none.
func (s *Server) assign(claim *unstructured.Unstructured) (string, string, string) {
	ns := claim.GetNamespace()
	poolName, _, _ := unstructured.NestedString(claim.Object, "spec", "warmPoolRef", "name")
	pool := s.st.objects["sandboxwarmpools"][key(ns, poolName)]
	if pool == nil {
		return "", "WarmPoolNotFound", fmt.Sprintf("SandboxWarmPool %q not found", poolName)
	}
	tmplName, _, _ := unstructured.NestedString(pool.Object, "spec", "sandboxTemplateRef", "name")
	tmpl := s.st.objects["sandboxtemplates"][key(ns, tmplName)]
	if tmpl == nil {
		return "", "TemplateNotFound", fmt.Sprintf("SandboxTemplate %q not found", tmplName)
	}
	env, _, _ := unstructured.NestedSlice(claim.Object, "spec", "env")
	vcts, _, _ := unstructured.NestedSlice(claim.Object, "spec", "volumeClaimTemplates")
	if len(env) > 0 {
		if p, _, _ := unstructured.NestedString(tmpl.Object, "spec", "envVarsInjectionPolicy"); p != "Allowed" && p != "Overrides" {
			return "", "EnvVarsInjectionRejected", fmt.Sprintf("SandboxTemplate %q does not allow env var injection", tmplName)
		}
	}
	if len(env) == 0 && len(vcts) == 0 {
		for _, sb := range s.sorted("sandboxes") {
			if sb.GetNamespace() != ns || sb.GetLabels()[warmPoolLabel] != poolName || !isReady(sb) {
				continue
			}
			next := sb.DeepCopy()
			lbl := next.GetLabels()
			delete(lbl, warmPoolLabel)
			next.SetLabels(lbl)
			ann := next.GetAnnotations()
			if ann == nil {
				ann = map[string]string{}
			}
			ann[launchTypeAnno] = "warm"
			next.SetAnnotations(ann)
			next.SetOwnerReferences([]metav1.OwnerReference{ownerRef(claim)})
			s.put(mustResource("Sandbox"), next, watch.Modified)
			return sb.GetName(), "", ""
		}
	}
	sb := s.sandboxFrom(tmpl, claim.GetName(), claim, env)
	sb.SetAnnotations(map[string]string{launchTypeAnno: "cold"})
	if _, err := s.createLocked(mustResource("Sandbox"), sb); err != nil {
		return "", reasonReconcilerErr, "Error seen: " + err.Error()
	}
	return claim.GetName(), "", ""
}

// defaultTemplate is Options.Template: the shape of the repository's template (one sandboxd
// container, uid 1000, /mnt/data), with env injection allowed.
func (s *Server) defaultTemplate() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
		"metadata": map[string]any{"name": s.opts.Template, "namespace": s.ns},
		"spec": map[string]any{
			"envVarsInjectionPolicy":  "Allowed",
			"networkPolicyManagement": "Managed",
			"networkPolicy":           map[string]any{"ingress": []any{}, "egress": []any{}},
			"podTemplate": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"app.kubernetes.io/name": "ciproxy-sandbox"}},
				"spec": map[string]any{
					"automountServiceAccountToken": false,
					"securityContext":              map[string]any{"runAsNonRoot": true, "runAsUser": int64(podUID), "runAsGroup": int64(podUID)},
					"containers": []any{map[string]any{
						"name": "sandbox", "image": "agentsandboxtest/sandbox:latest",
						"ports": []any{
							map[string]any{"name": "grpc", "containerPort": int64(s.processPort)},
							map[string]any{"name": "files", "containerPort": int64(s.filesPort)},
						},
						"volumeMounts": []any{map[string]any{"name": "data", "mountPath": podRoot}},
					}},
					"volumes": []any{map[string]any{"name": "data", "emptyDir": map[string]any{}}},
				},
			},
		},
	}}
}

func (s *Server) defaultPool() *unstructured.Unstructured {
	replicas := int64(s.opts.WarmPoolReplicas)
	if replicas == 0 {
		replicas = 1
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
		"metadata": map[string]any{"name": s.opts.WarmPool, "namespace": s.ns},
		"spec":     map[string]any{"replicas": replicas, "sandboxTemplateRef": map[string]any{"name": s.opts.Template}},
	}}
}
