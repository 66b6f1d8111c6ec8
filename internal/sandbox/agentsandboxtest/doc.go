// Package agentsandboxtest is a test double of kubernetes-sigs/agent-sandbox as an
// agent_sandbox backend sees it: a Kubernetes API server serving the four agent-sandbox custom
// resources, the Sandbox, warm-pool and claim controllers, pods, sandboxd in every pod
// (the gRPC process service and the REST files API) and, optionally, sandbox-router. Everything
// runs in the test's process over real sockets; New (or Start) builds it, t.Cleanup (or Close)
// kills every pod.
//
// Faithful:
//   - The API is reached with client-go from a kubeconfig (TLS with the server's CA, a bearer
//     token; no token is 401). Discovery, create (generateName), get, list and watch (label and
//     field selectors), delete and JSON merge patch on claims answer as the API server does,
//     errors included (metav1.Status: 404 NotFound, 409 AlreadyExists, 422 Invalid, 410 Gone for
//     a watch from a compacted resource version, Compact). Resource versions only grow; every
//     change is a watch event; bookmarks are sent when asked for.
//   - Objects are pruned, defaulted and validated with apiextensions-apiserver's own code
//     against upstream's CRDs, kept as data in testdata/crds (see its README). Validate checks a
//     manifest the same way.
//   - Controllers: a SandboxWarmPool keeps spec.replicas Sandboxes (label
//     agents.x-k8s.io/warm-pool-sandbox); a SandboxClaim adopts a ready one (annotation
//     agents.x-k8s.io/sandbox-name, status.sandbox {name, podIPs}, the Sandbox's Ready condition
//     forwarded) and the pool replenishes; env or volumeClaimTemplates force a cold start from
//     the template (env only if the template's envVarsInjectionPolicy allows it); shutdown times
//     of claims and Sandboxes and their policies; deleting an owner deletes what it owns
//     (ownerReferences), and deleting a Sandbox kills its pod. Condition reasons are upstream's.
//   - sandboxd's process service follows upstream's pkg/server/process.go (init first, chunks of
//     at most 4096 bytes, exit code, -1 for a signal, the process killed when its Start stream
//     ends, signals to the process group, the same status codes) and the files API its
//     filesystem.go and pathutil (paths relative to /mnt/data, symlink-aware confinement with the
//     same JSON errors, listings, PUT raw or multipart with a mode, recursive DELETE, health,
//     metadata with sensitive names withheld).
//   - The router: X-Sandbox-* headers, the same {"detail"} errors, HTTP/1.1 upstream, and the
//     scoped-token authorizer (v1.<payload>.<hmac>, exp exclusive).
//
// Simplified:
//   - A pod is one long-lived bwrap (own pid, ipc, uts, mount and network namespaces; /usr and
//     /etc of the host read-only, the pod's data directory at /mnt/data, its own /tmp,
//     Options.ImageFiles read-only). Its network namespace holds a loopback alone, which is what
//     the repository's template asks (a NetworkPolicy with no egress): the code reaches nothing.
//     sandboxd runs in the test's process, outside the pod, on a loopback address 127.1.x.y of
//     the pod's own: that is the pod's "IP". Commands enter it with nsenter and setpriv (uid and gid 1000, no
//     capabilities, no_new_privs); killing the pod kills its pid namespace's init, and so every
//     process in it, detached daemons included. There is no resource limit and no image: whatever the
//     host has in /usr is what the pod has. Root is required.
//   - The pod's env is PATH, HOME (/mnt/data), HOSTNAME, LANG, Options.PodEnv and the Sandbox's
//     first container's literal env values; nothing else of the pod spec is honoured.
//   - With Options.PodImage, a pod is instead a podman container of that image (host network,
//     the image's entrypoint given --listen-host=<the pod's 127.1.x.y>): the image's sandboxd,
//     user and files, with HOSTNAME, PodEnv and the container's env values added.
//   - Sandboxd (cmd/sandboxd) is the same process service and files API without a pod: commands
//     are children of the serving process, as sandboxd runs them as its container's process; it
//     is the stand-in sandboxd that the sandbox image is built with here.
//   - No PTY: Start with a pty is FAILED_PRECONDITION, as is ResizeTTY.
//   - Symlinks are resolved on the host: a link to an absolute pod path under /mnt/data points
//     outside the root there and is refused, where the real sandboxd would follow it.
//   - Killing the Start stream kills the command's whole process group (upstream kills the
//     command alone, whose children may outlive it).
//   - CEL rules (x-kubernetes-validations) are not evaluated; there is no resourceVersion
//     precondition on delete, no finalizers (DeleteForeground deletes at once), no status
//     subresource endpoint, no update (PUT) and no patch of anything but claims.
//   - The router routes by name to the Sandbox's pod (its name cache), accepts X-Sandbox-Pod-IP
//     only when it names a live pod (the real one refuses loopback), and does not retry a failed
//     dial. A pod whose Ready condition is False is still reachable.
//
// Fault hooks (FailCreates, StallClaims, HoldReadiness, DropWatches, KillPod,
// RefuseRouterTokens, Compact) and inspection (LivePods, LiveClaims, WatchDrops, Requests,
// ProcessEnvs) let a backend's tests reach the failure paths.
package agentsandboxtest
