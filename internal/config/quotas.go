package config

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"regexp"

	"github.com/ciproxy/ciproxy/internal/settings"
	"gopkg.in/yaml.v3"
)

// Defaults of the quotas (general_settings) and of the per-request limits
// (code_interpreter_interception_params). They are meant to be out of reach of a real client and
// within reach of an abusive one; config.example.yaml documents the same values. The per-key
// shares of the totals have no constant: they derive from the keys configured (fairShare).
const (
	DefaultMaxContainers             = 128 // in total, the warm pools included
	DefaultContainerCreatesPerMinute = 600 // per key, refilled continuously: 10 a second
	DefaultContainerCreateBurst      = 100 // per key
	DefaultMaxConcurrentRequests     = 256

	DefaultMaxCallsPerTurn   = 16
	DefaultMaxExecutions     = 64
	DefaultMaxCodeSize       = 1 << 20
	DefaultMaxResponseOutput = 32 << 20
)

// Quotas bound what one caller (and, for the totals, every caller together) may hold at once. Every
// field is above 0 once parsed.
type Quotas struct {
	// MaxContainers is how many containers all callers together may hold: local ones in this
	// process, the warm pools included, and e2b ones in the whole deployment (every replica on
	// the store) (general_settings.max_containers; not overridable per key).
	MaxContainers int
	// MaxContainersPerKey is how many containers one caller may hold.
	MaxContainersPerKey int
	// ContainerCreatesPerMinute and ContainerCreateBurst are one caller's token bucket of container
	// creations: it holds ContainerCreateBurst and refills at ContainerCreatesPerMinute.
	ContainerCreatesPerMinute int
	ContainerCreateBurst      int
	// MaxConcurrentRequests is how many intercepted requests all callers together may have in
	// flight (not overridable per key); MaxConcurrentRequestsPerKey is one caller's share.
	MaxConcurrentRequests       int
	MaxConcurrentRequestsPerKey int
}

// ClientKey is one general_settings.client_keys entry: a key clients may send besides master_key,
// and the owner name of what requests with it create.
type ClientKey struct {
	// Name is the owner of the containers, files and responses the key creates.
	Name string
	// Quotas are general_settings' quotas with the entry's overrides applied.
	Quotas Quotas
	// MissingEnv names the variable that key referred to and that is not set: the entry then
	// matches no key.
	MissingEnv string

	digest [sha256.Size]byte // of the key; the key itself is not kept
}

// keyNameRE is what a client key's name may be: it names an owner in logs and metrics.
var keyNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$`)

// hexOwnerRE matches the owner ids derived from a key's hash (the master key's, an open proxy's),
// which a name must not look like.
var hexOwnerRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// clientKeyOverrides are the keys of a client_keys entry that override general_settings' quotas.
var clientKeyOverrides = []string{"max_containers", "container_creates_per_minute", "container_create_burst", "max_concurrent_requests"}

// Open reports whether the proxy accepts any caller: no master_key and no client key.
func (g General) Open() bool { return g.MasterKey == "" && len(g.ClientKeys) == 0 }

// ClientKeyFor returns the client key entry whose key is presented, comparing in constant time.
func (g General) ClientKeyFor(presented string) (ClientKey, bool) {
	got := sha256.Sum256([]byte(presented))
	found := -1
	for i, k := range g.ClientKeys {
		if k.MissingEnv == "" && subtle.ConstantTimeCompare(got[:], k.digest[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return ClientKey{}, false
	}
	return g.ClientKeys[found], true
}

// quotas reads general_settings' quota keys; keys is how many keys callers may present (see
// fairShare).
func (d *decoder) quotas(p *settings.Map, keys int) Quotas {
	q := Quotas{
		MaxContainers:             p.Int("max_containers", DefaultMaxContainers, 1),
		ContainerCreatesPerMinute: p.Int("container_creates_per_minute", DefaultContainerCreatesPerMinute, 1),
		ContainerCreateBurst:      p.Int("container_create_burst", DefaultContainerCreateBurst, 1),
		MaxConcurrentRequests:     p.Int("max_concurrent_requests", DefaultMaxConcurrentRequests, 1),
	}
	q.MaxContainersPerKey = p.Int("max_containers_per_key", fairShare(q.MaxContainers, keys), 1)
	q.MaxConcurrentRequestsPerKey = p.Int("max_concurrent_requests_per_key", fairShare(q.MaxConcurrentRequests, keys), 1)
	return q
}

// fairShare is the default per-key share of a total when keys keys are configured (master_key and
// the client_keys entries): the whole total for one key or none (an open proxy, whose callers are
// as many as the keys they make up, is bound by the total alone), else an equal share rounded up,
// so that one key cannot take the host from the others while a client that uses one key as it
// would use OpenAI reaches the host's real capacity before any per-key 429.
func fairShare(total, keys int) int {
	if keys <= 1 {
		return total
	}
	return (total + keys - 1) / keys
}

// keyCount is how many keys general_settings configures: master_key and each client_keys entry.
func keyCount(master string, clientKeys *yaml.Node) int {
	n := 0
	if master != "" {
		n++
	}
	if l := settings.Deref(clientKeys); l != nil && l.Kind == yaml.SequenceNode {
		n += len(l.Content)
	}
	return n
}

// clientKeys reads general_settings.client_keys. Keys are secrets: no message quotes one.
func (d *decoder) clientKeys(n *yaml.Node, base Quotas, master string) []ClientKey {
	const path = "general_settings.client_keys"
	n = settings.Deref(n)
	if settings.IsNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.Errorf(n.Line, "%s must be a list", path)
		return nil
	}
	var out []ClientKey
	names := map[string]int{}
	digests := map[[sha256.Size]byte]int{}
	if master != "" {
		digests[sha256.Sum256([]byte(master))] = -1
	}
	for i, item := range n.Content {
		item = settings.Deref(item)
		ipath := fmt.Sprintf("%s[%d]", path, i)
		p := d.Map(item, ipath, ipath, append([]string{"name", "key"}, clientKeyOverrides...), nil)
		if item.Kind != yaml.MappingNode {
			continue
		}
		k := ClientKey{Quotas: base}
		name := p.String("name")
		switch {
		case !name.Present || name.S == "":
			d.Errorf(item.Line, "%s: name is required", ipath)
		case !keyNameRE.MatchString(name.S):
			d.Errorf(p.ValueLine("name"), "%s: %s is not a valid name (1 to 64 letters, digits, _ . @ or -, starting with a letter or digit)", p.Key("name"), name.Shown())
		case hexOwnerRE.MatchString(name.S):
			d.Errorf(p.ValueLine("name"), "%s: %s looks like the owner id of an unnamed key (32 hex digits); choose another name", p.Key("name"), name.Shown())
		default:
			if j, dup := names[name.S]; dup {
				d.Errorf(p.ValueLine("name"), "%s: %s is already the name of %s[%d]", p.Key("name"), name.Shown(), path, j)
			}
			names[name.S] = i
			k.Name = name.S
		}
		key := p.String("key")
		switch {
		case key.Env != "" && !key.Present:
			k.MissingEnv = key.Env
			d.AmendWarning(": the key of " + ipath + " is refused until it is set")
		case !key.Present || key.S == "":
			d.Errorf(item.Line, "%s: key is required", ipath)
		default:
			k.digest = sha256.Sum256([]byte(key.S))
			if j, dup := digests[k.digest]; dup {
				other := "master_key"
				if j >= 0 {
					other = fmt.Sprintf("%s[%d]", path, j)
				}
				d.Errorf(p.ValueLine("key"), "%s: the same key as %s (each caller needs its own key)", p.Key("key"), other)
			}
			digests[k.digest] = i
		}
		k.Quotas.MaxContainersPerKey = p.Int("max_containers", base.MaxContainersPerKey, 1)
		k.Quotas.ContainerCreatesPerMinute = p.Int("container_creates_per_minute", base.ContainerCreatesPerMinute, 1)
		k.Quotas.ContainerCreateBurst = p.Int("container_create_burst", base.ContainerCreateBurst, 1)
		k.Quotas.MaxConcurrentRequestsPerKey = p.Int("max_concurrent_requests", base.MaxConcurrentRequestsPerKey, 1)
		out = append(out, k)
	}
	return out
}

// limits reads the per-request limits of code_interpreter_interception_params.
func (d *decoder) limits(p *settings.Map, in *Interception) {
	in.MaxCallsPerTurn = p.Int("max_calls_per_turn", DefaultMaxCallsPerTurn, 1)
	in.MaxExecutions = p.Int("max_executions", DefaultMaxExecutions, 1)
	size, _ := p.Size("max_code_size", DefaultMaxCodeSize)
	if size > 1<<30 {
		d.Errorf(p.ValueLine("max_code_size"), "%s: must be at most 1g", p.Key("max_code_size"))
		size = DefaultMaxCodeSize
	}
	in.MaxCodeSize = int(size)
	in.MaxResponseOutput, _ = p.Size("max_response_output", DefaultMaxResponseOutput)
}
